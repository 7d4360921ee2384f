"""Block names: one workload key, other block names (the same operator in another model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from farm.client import cache
from farm.core.messages import TuneTask
from farm.core.profiles import resolve_profile
from farm.jobs.finalize import write_best_log
from farm.pipeline.extract import workload_key
from farm.store import StoredRecord, candidate_hash, open_store
from farm.tir.blocknames import block_names, canonical, canonical_module, translate


def matmul(a_name: str, out_name: str, n: int = 16):
    """A matmul whose block is named after its output tensor (as TVM names blocks after the
    Relax variables around them)."""
    import tvm
    from tvm import te

    a = te.placeholder((n, n), name=a_name)
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name=out_name)
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


def record_on(mod, target, split: int = 4, us: float = 10.0) -> list:
    """A record tuned on `mod` (its trace gets the first block by its name in `mod`)."""
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

    sch = Schedule(mod)
    block = sch.get_sblock(block_names(mod["main"])[0])
    sch.split(sch.get_loops(block)[0], factors=[None, split])
    return TuningRecord(sch.trace, Workload(mod), [us / 1e6], target,
                        ArgInfo.from_prim_func(mod["main"])).as_json()


def applies(record: list, mod) -> bool:
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

    try:
        TuningRecord.from_json(record, Workload(mod)).as_measure_candidate()
    except Exception:  # noqa: BLE001
        return False
    return True


def key_of(mod, profile) -> str:
    import tvm_ffi

    return workload_key(tvm_ffi.structural_hash(mod), profile.target_json(), profile.key)


def test_one_key_other_block_names_and_canonical_names_make_them_equal():
    import tvm
    import tvm_ffi

    profile = resolve_profile("cpu-local")
    target = tvm.target.Target(profile.target_json())
    one, other = matmul("A", "C"), matmul("X", "lv35_red")
    assert key_of(one, profile) == key_of(other, profile)  # the key ignores block names
    assert block_names(one["main"]) != block_names(other["main"])
    assert not applies(record_on(one, target), other)  # what broke a job at its end

    c_one, c_other = canonical_module(one), canonical_module(other)
    assert block_names(c_one["main"]) == block_names(c_other["main"]) == ["block_0", "root"]
    assert tvm_ffi.structural_equal(c_one, one) and key_of(c_one, profile) == key_of(one, profile)
    assert block_names(one["main"]) == ["C", "root"]  # a copy: the module given is untouched
    assert applies(record_on(c_one, target), c_other)
    assert canonical(c_one["main"]).same_as(c_one["main"])  # canonical already: as it is


def test_translate_renames_the_trace_to_the_blocks_it_is_applied_to():
    import tvm

    target = tvm.target.Target(resolve_profile("cpu-local").target_json())
    one, other = matmul("A", "C"), matmul("X", "Z")
    rec = record_on(one, target)
    moved = translate(rec, one, other)
    assert applies(moved, other) and not applies(moved, one)
    assert moved[1:] == rec[1:] and translate(rec, one, one) is rec
    bigger = matmul("A", "C")
    bigger["second"] = matmul("Q", "R")["main"]
    with pytest.raises(ValueError, match="do not correspond"):
        translate(rec, one, bigger)


def _job_task(mod, profile, name: str = "matmul") -> TuneTask:
    import tvm

    return TuneTask(name=name, workload_key=key_of(mod, profile), weight=1,
                    mod_json=tvm.ir.save_json(mod), target=profile.target_json(),
                    device_key=profile.key)


def test_finalize_applies_a_record_stored_under_other_block_names(tmp_path: Path):
    """A store filled before canonical names (or by another model): its record is translated to
    the job's blocks; the log written applies to the job's module."""
    import tvm
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    profile = resolve_profile("cpu-local")
    target = tvm.target.Target(profile.target_json())
    stored, job_mod = matmul("A", "C"), canonical_module(matmul("X", "lv7_red"))
    store = open_store("memory://")
    store.put_workload(_job_task(stored, profile, "stored"))
    rec = record_on(stored, target)
    wk = key_of(stored, profile)
    store.add_record(StoredRecord(workload_key=wk, candidate=candidate_hash(rec), record=rec,
                                  run_us=10.0, job_id="old"))
    unusable: dict[str, str] = {}
    bests = write_best_log(store, [_job_task(job_mod, profile)], tmp_path / "best",
                           {wk: candidate_hash(rec)}, unusable)
    assert unusable == {} and bests[wk] is not None
    db = JSONDatabase(work_dir=str(tmp_path / "best"), module_equality="structural")
    assert db.query_schedule(job_mod, target, "main") is not None


def test_finalize_leaves_a_task_untuned_when_its_record_does_not_apply(tmp_path: Path):
    """One unusable record costs its task's tuning, not the job's result."""
    import tvm

    profile = resolve_profile("cpu-local")
    target = tvm.target.Target(profile.target_json())
    mod = canonical_module(matmul("A", "C"))
    store = open_store("memory://")
    task = _job_task(mod, profile)
    store.put_workload(task)
    rec = record_on(mod, target)
    rec[0][0][0][2][0] = "NO_SUCH_BLOCK"
    store.add_record(StoredRecord(workload_key=task.workload_key, candidate=candidate_hash(rec),
                                  record=rec, run_us=10.0, job_id="j"))
    unusable: dict[str, str] = {}
    bests = write_best_log(store, [task], tmp_path / "best",
                           {task.workload_key: candidate_hash(rec)}, unusable)
    assert bests[task.workload_key] is None
    assert "does not apply" in unusable[task.workload_key]
    assert (tmp_path / "best" / "database_tuning_record.json").exists()


def test_import_files_records_under_the_stored_workloads_block_names(tmp_path: Path):
    """A log tuned on a module with other block names, imported into a store that has the
    workload already: its records apply to the store's module (the rounds tune that one)."""
    import tvm
    from tvm.s_tir.meta_schedule.database import JSONDatabase, TuningRecord

    profile = resolve_profile("cpu-local")
    target = tvm.target.Target(profile.target_json())
    theirs, ours = matmul("A", "C"), canonical_module(matmul("X", "Z"))
    (tmp_path / "log").mkdir()
    db = JSONDatabase(work_dir=str(tmp_path / "log"), module_equality="structural")
    db.commit_tuning_record(TuningRecord.from_json(record_on(theirs, target),
                                                   db.commit_workload(theirs)))
    store = open_store("memory://")
    store.put_workload(_job_task(ours, profile))
    got = cache.import_log(store, tmp_path / "log", profile)
    assert (got.new, dict(got.refused)) == (1, {})
    (rec,) = store.records(key_of(ours, profile))
    assert applies(rec.record, ours) and not applies(rec.record, theirs)

    fresh = open_store("memory://")  # a new workload is filed with canonical names
    cache.import_log(fresh, tmp_path / "log", profile)
    filed = fresh.get_workload(key_of(ours, profile))
    assert block_names(tvm.ir.load_json(filed.mod_json)["main"]) == ["block_0", "root"]
    assert applies(fresh.records(key_of(ours, profile))[0].record, ours)
