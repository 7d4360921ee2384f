"""Traces are data: a record whose trace links foreign native code (`pragma_import_llvm`) is
refused at `farm cache import` and never built by a worker or a compile, even when written
straight into the store (farm/core/traces.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from farm.client import cache
from farm.core.profiles import resolve_profile
from farm.store import StoredRecord, candidate_hash, open_store
from tests.unit.test_cache import matmul_mod, seed_store

LLVM_IR = 'define void @evil() { call i32 @system(i8* null) ret void }'


def poisoned(profile, n: int = 16) -> dict:
    """A record of the matmul whose trace annotates a loop with pragma_import_llvm."""
    import tvm
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

    mod = matmul_mod(n)
    sch = Schedule(mod)
    loops = sch.get_loops(sch.get_sblock("C"))
    sch.annotate(loops[0], "pragma_import_llvm", LLVM_IR)
    return TuningRecord(sch.trace, Workload(mod), [1e-6],
                        tvm.target.Target(profile.target_json()),
                        ArgInfo.from_prim_func(mod["main"])).as_json()


def test_cache_import_refuses_a_trace_that_links_native_code(tmp_path: Path):
    profile = resolve_profile("cpu-local")
    src = open_store("memory://")
    wk = seed_store(src, profile, 16, [30.0])
    assert cache.export(src, tmp_path / "log") == 1
    records = tmp_path / "log" / "database_tuning_record.json"
    with records.open("a") as fh:  # the log as an attacker hands it over: one more line
        fh.write(json.dumps([0, poisoned(profile)]) + "\n")
    dst = open_store("memory://")
    tally = cache.import_log(dst, tmp_path / "log", profile)
    assert tally.new == 1  # the plain record
    assert any("pragma_import_llvm" in line for line in tally.lines()), tally.lines()
    assert all("pragma_import" not in str(r.record) for r in dst.records(wk))


def test_a_worker_never_builds_a_stored_record_that_links_native_code():
    from tvm.s_tir.meta_schedule.database import Workload

    from farm.jobs import finalize
    from workers.metaschedule.database import StoreDatabase, tuning_record

    profile = resolve_profile("cpu-local")
    store = open_store("memory://")
    wk = seed_store(store, profile, 16, [30.0])
    bad = poisoned(profile)
    rec = StoredRecord(workload_key=wk, candidate=candidate_hash(bad), record=bad, run_us=1.0,
                       job_id="other")  # written by someone else, straight into the store
    store.add_record(rec)
    assert store.best(wk).candidate == rec.candidate  # the fastest record of the store
    mod = matmul_mod(16)
    with pytest.raises(ValueError, match="pragma_import_llvm"):
        tuning_record(rec, Workload(mod))
    db = StoreDatabase(store, wk, mod)
    top = db.get_top_k(db.commit_workload(mod), 5)
    assert len(top) == 1 and "pragma_import" not in str(top[0].as_json())
    with pytest.raises(ValueError, match="pragma_import_llvm"):  # the compile's log: refused
        finalize._commit(None, store, store.get_workload(wk), rec)


def test_cache_import_refuses_a_workload_that_calls_out_of_tvm(tmp_path: Path):
    """A workload's own TIR can name a C function (`call_extern("system", ...)`): its kernels
    would call it on the builder and on every phone. Refused at import, with its records."""
    import tvm
    import tvm.tirx as tx
    from tvm import te
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.database import JSONDatabase, TuningRecord

    from farm.core.traces import foreign_calls

    profile = resolve_profile("cpu-local")
    a = te.placeholder((4,), name="A")
    b = te.compute((4,), lambda i: tx.call_extern("float32", "system", a[i]), name="B")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b])})
    assert foreign_calls(tvm.ir.save_json(mod)) == ["call_extern"]
    assert foreign_calls(tvm.ir.save_json(matmul_mod())) == []  # a model's own task: none
    (tmp_path / "log").mkdir()
    db = JSONDatabase(work_dir=str(tmp_path / "log"))
    rec = TuningRecord(Schedule(mod).trace, db.commit_workload(mod), [1e-6],
                       tvm.target.Target(profile.target_json()),
                       ArgInfo.from_prim_func(mod["main"]))
    db.commit_tuning_record(rec)
    dst = open_store("memory://")
    tally = cache.import_log(dst, tmp_path / "log", profile, retarget=True)
    assert tally.new == 0 and dst.workload_keys() == []
    assert any("calls outside TVM's operators (call_extern)" in line for line in tally.lines())


def layout_log(tmp_path: Path, profile, index_map, pad_value=None, injective=False) -> Path:
    """A JSONDatabase of the matmul with one record whose trace transforms C's layout by
    `index_map`, written by MetaSchedule's own JSONDatabase (as a TVM user hands it over)."""
    import tvm
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.database import JSONDatabase, TuningRecord

    mod = matmul_mod(16)
    sch = Schedule(mod)
    sch.transform_layout(sch.get_sblock("C"), ("write", 0), index_map, pad_value=pad_value,
                         assume_injective_transform=injective)
    (tmp_path / "log").mkdir(parents=True)
    db = JSONDatabase(work_dir=str(tmp_path / "log"), module_equality="structural")
    db.commit_tuning_record(TuningRecord(sch.trace, db.commit_workload(mod), [2e-6],
                                         tvm.target.Target(profile.target_json()),
                                         ArgInfo.from_prim_func(mod["main"])))
    return tmp_path / "log"


def evil_map(i, j):
    """An index map whose C's column is computed by calling a C function of the attacker's."""
    import tvm.tirx as tx

    return i, tx.floormod(j + tx.call_extern("int32", "system", 0), 16)


def test_an_honest_layout_transform_imports_and_replays(tmp_path: Path):
    """A trace with a TransformLayout (its index map a TVM JSON graph in a string) imports,
    is stored as plain JSON and becomes a schedule again (it ended in a TypeError traceback)."""
    from tvm.s_tir.meta_schedule.database import Workload

    from farm.tir.module import load_mod, tuning_record

    profile = resolve_profile("cpu-local")
    log = layout_log(tmp_path, profile, lambda i, j: (j, i))
    dst = open_store("memory://")
    tally = cache.import_log(dst, log, profile)
    assert (tally.new, tally.lines()) == (1, [])
    (wk,) = dst.workload_keys()
    (rec,) = dst.records(wk)
    json.dumps(rec.record)  # plain JSON, as the store keeps it
    replayed = tuning_record(rec.record, Workload(load_mod(dst.get_workload(wk))))
    assert "transform_layout" in str(replayed.trace)


def test_an_index_map_that_calls_a_function_is_refused_at_import(tmp_path: Path):
    """The attack as reproduced: an index map holding `call_extern("system", ...)` (with
    assume_injective_transform) passed the allow-list, replayed, built and ran the command."""
    profile = resolve_profile("cpu-local")
    log = layout_log(tmp_path, profile, evil_map, injective=True)
    dst = open_store("memory://")
    tally = cache.import_log(dst, log, profile)
    assert tally.new == 0
    assert dst.workload_keys() == []  # no empty workload left behind
    (line,) = tally.lines()
    assert "TransformLayout" in line and "ir.Call" in line, line


def test_a_pad_value_that_calls_a_function_is_refused(tmp_path: Path):
    """A layout transform's pad value is an IR graph too (an attribute TVM parses whatever
    its first character): checked like the index map."""
    import tvm
    import tvm.tirx as tx

    from farm.core.traces import trace_problem

    profile = resolve_profile("cpu-local")
    log = layout_log(tmp_path, profile, lambda i, j: (j, i))
    row = json.loads((log / "database_tuning_record.json").read_text().splitlines()[0])
    inst = next(x for x in row[1][0][0] if x[0] == "TransformLayout")
    assert trace_problem(row[1]) is None
    evil = tx.IndexMap.from_func(lambda i, j: (tx.call_extern("float32", "system", 0),))
    inst[2][2] = tvm.ir.save_json(evil)
    assert "ir.Call" in (trace_problem(row[1]) or "")
    inst[2][2] = ' {"nodes": []}'  # not starting with "{": TVM parses it all the same
    assert trace_problem(row[1]) is not None


def test_a_stored_evil_index_map_is_refused_at_every_use(tmp_path: Path):
    """Written straight into the store (anyone who can write to Redis): a worker's warm start
    skips it, a compile's log refuses it, a transfer does not read it."""
    from tvm.s_tir.meta_schedule.database import Workload

    from farm.jobs import finalize
    from farm.tir.module import tuning_record as tir_record
    from workers.metaschedule.database import StoreDatabase

    profile = resolve_profile("cpu-local")
    log = layout_log(tmp_path, profile, evil_map, injective=True)
    bad = json.loads((log / "database_tuning_record.json").read_text().splitlines()[0])[1]
    store = open_store("memory://")
    wk = seed_store(store, profile, 16, [30.0])
    rec = StoredRecord(workload_key=wk, candidate=candidate_hash(bad), record=bad, run_us=1.0,
                       job_id="other")
    store.add_record(rec)
    mod = matmul_mod(16)
    with pytest.raises(ValueError, match="ir.Call"):
        tir_record(bad, Workload(mod))
    db = StoreDatabase(store, wk, mod)
    top = db.get_top_k(db.commit_workload(mod), 5)
    assert len(top) == 1 and "transform_layout" not in str(top[0].trace)
    with pytest.raises(ValueError, match="ir.Call"):
        finalize._commit(None, store, store.get_workload(wk), rec)


def test_the_replayed_schedule_is_checked_when_the_trace_check_misses(tmp_path: Path,
                                                                      monkeypatch):
    """The second line: were the trace's check to miss a way in, the module the replayed
    trace makes is checked for calls out of TVM before anything builds it."""
    from tvm.s_tir.meta_schedule.database import Workload

    from farm.core.traces import UnsafeTrace
    from farm.tir import module

    profile = resolve_profile("cpu-local")
    log = layout_log(tmp_path, profile, evil_map, injective=True)
    bad = json.loads((log / "database_tuning_record.json").read_text().splitlines()[0])[1]
    monkeypatch.setattr(module, "check_trace", lambda record: None)  # a hole in line one
    with pytest.raises(UnsafeTrace, match="call_extern"):
        module.tuning_record(bad, Workload(matmul_mod(16)))
    honest = json.loads((layout_log(tmp_path / "ok", profile, lambda i, j: (j, i))
                         / "database_tuning_record.json").read_text().splitlines()[0])[1]
    assert module.tuning_record(honest, Workload(matmul_mod(16))) is not None


def test_record_json_is_metaschedules_own_where_it_can_write_one():
    """The store hashes a record's JSON to deduplicate it: `record_json` must write what
    TuningRecord.as_json writes (for every trace that has no index map)."""
    import tvm
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

    from farm.tir.module import record_json

    mod = matmul_mod(16)
    sch = Schedule(mod)
    i, j, k = sch.get_loops(sch.get_sblock("C"))
    sch.split(i, factors=[None, 4])
    sch.sample_perfect_tile(j, n=2)
    rec = TuningRecord(sch.trace, Workload(mod), [1.5e-6, 2e-6],
                       tvm.target.Target(resolve_profile("cpu-local").target_json()),
                       ArgInfo.from_prim_func(mod["main"]))
    assert record_json(rec) == rec.as_json()
    assert candidate_hash(record_json(rec)) == candidate_hash(rec.as_json())


def test_the_replayed_schedule_may_not_call_what_the_workload_does_not(monkeypatch):
    """The second line compares what is called, not only how: a workload that calls the C
    function `expf` does not let its schedule call `system` the same way."""
    import tvm
    import tvm.tirx as tx
    from tvm import te
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

    from farm.core.traces import UnsafeTrace
    from farm.tir import module

    a = te.placeholder((16, 16), name="A")
    b = te.compute((16, 16), lambda i, j: tx.call_pure_extern("float32", "expf", a[i, j]),
                   name="B")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b])})
    sch = Schedule(mod)
    sch.transform_layout(sch.get_sblock("B"), ("write", 0), lambda i, j: (
        i, tx.floormod(j + tx.call_pure_extern("int32", "system", 0), 16)),
        assume_injective_transform=True)
    rec = module.record_json(TuningRecord(sch.trace, Workload(mod), [1e-6],
                                          tvm.target.Target("llvm"),
                                          ArgInfo.from_prim_func(mod["main"])))
    monkeypatch.setattr(module, "check_trace", lambda record: None)  # a hole in line one
    with pytest.raises(UnsafeTrace, match=r"call_pure_extern\(system\)"):
        module.tuning_record(rec, Workload(mod))
    plain = module.record_json(TuningRecord(Schedule(mod).trace, Workload(mod), [1e-6],
                                            tvm.target.Target("llvm"),
                                            ArgInfo.from_prim_func(mod["main"])))
    assert module.tuning_record(plain, Workload(mod)) is not None  # expf: the workload's own
