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
    report = cache.import_log(dst, tmp_path / "log", profile)
    assert report.new == 1  # the plain record
    assert any("pragma_import_llvm" in line for line in report.lines()), report.lines()
    assert all("pragma_import" not in str(r.record) for r in dst.records(wk))


def test_a_worker_never_builds_a_stored_record_that_links_native_code():
    from tvm.s_tir.meta_schedule.database import Workload

    from farm.jobs import finalize
    from workers.round.database import StoreDatabase, tuning_record

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
    report = cache.import_log(dst, tmp_path / "log", profile, retarget=True)
    assert report.new == 0 and dst.workload_keys() == []
    assert any("calls outside TVM's operators (call_extern)" in line for line in report.lines())
