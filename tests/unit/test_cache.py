"""farm cache export/import: the store <-> a MetaSchedule JSONDatabase, both ways."""

from __future__ import annotations

from pathlib import Path

import pytest

from farm import cache
from farm.extract import workload_key
from farm.messages import TuneTask
from farm.profiles import resolve_profile
from farm.store import StoredRecord, candidate_hash, open_store


def matmul_mod(n: int = 16):
    import tvm
    from tvm import te

    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


def seed_store(store, profile, n: int, times_us: list[float]) -> str:
    import tvm
    import tvm_ffi
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

    mod = matmul_mod(n)
    target = tvm.target.Target(profile.target_json())
    wk = workload_key(tvm_ffi.structural_hash(mod), profile.target_json(), profile.key)
    store.put_workload(TuneTask(name=f"matmul{n}", workload_key=wk, weight=1,
                                mod_json=tvm.ir.save_json(mod), target=profile.target_json(),
                                device_key=profile.key))
    for i, us in enumerate(times_us):
        sch = Schedule(mod)
        block = sch.get_sblock("C")
        loops = sch.get_loops(block)
        sch.split(loops[0], factors=[None, 2 ** (i % 4 + 1)])
        rec = TuningRecord(sch.trace, Workload(mod), [us / 1e6], target,
                           ArgInfo.from_prim_func(mod["main"])).as_json()
        store.add_record(StoredRecord(workload_key=wk, candidate=candidate_hash(rec), record=rec,
                                      run_us=us, job_id="seed"))
    return wk


@pytest.mark.parametrize("n", [16])
def test_export_then_import_keeps_keys_and_best(tmp_path: Path, n: int):
    profile = resolve_profile("cpu-local")
    src = open_store("memory://")
    wk = seed_store(src, profile, n, [30.0, 10.0, 20.0, 40.0])
    assert cache.export(src, tmp_path / "log") == 1

    from tvm.s_tir.meta_schedule.database import JSONDatabase

    assert len(JSONDatabase(work_dir=str(tmp_path / "log")).get_all_tuning_records()) == 1

    dst = open_store("memory://")
    workloads, new = cache.import_log(dst, tmp_path / "log", profile)
    assert (workloads, new) == (1, 1)
    assert dst.best(wk).run_us == pytest.approx(10.0)
    assert cache.import_log(dst, tmp_path / "log", profile) == (1, 0)  # idempotent
    rows = cache.entries(dst)
    assert rows[0]["workload_key"] == wk and rows[0]["trials"] == 1
    shown = cache.show(src, wk)
    assert shown["trials"] == 4 and shown["top"][0]["run_us"] == pytest.approx(10.0)
    assert cache.stats(src)["trials"] == 4


def test_import_refuses_a_folder_that_is_no_database(tmp_path: Path):
    from farm.errors import UsageError

    with pytest.raises(UsageError, match="database_workload.json"):
        cache.import_log(open_store("memory://"), tmp_path, resolve_profile("cpu-local"))
