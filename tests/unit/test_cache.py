"""farm cache export/import: the store <-> a MetaSchedule JSONDatabase, both ways."""

from __future__ import annotations

from pathlib import Path

import pytest

from farm.client import cache
from farm.core.messages import TuneTask
from farm.core.profiles import resolve_profile
from farm.pipeline.extract import workload_key
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
    got = cache.import_log(dst, tmp_path / "log", profile)
    assert (got.workloads, got.new, dict(got.refused)) == (1, 1, {})
    imported = dst.records(wk)[0]
    assert imported.run_us == pytest.approx(10.0) and not imported.verified
    assert imported.source.startswith("import:") and imported.host
    assert dst.best(wk) is None  # unverified: no job takes it before a phone measured it
    again = cache.import_log(dst, tmp_path / "log", profile)  # idempotent
    assert (again.new, again.known) == (0, 1)
    rows = cache.entries(dst)
    assert rows[0]["workload_key"] == wk and rows[0]["trials"] == 0
    assert rows[0]["unverified"] == 1 and rows[0]["best_us"] is None
    shown = cache.show(src, wk)
    assert shown["trials"] == 4 and shown["top"][0]["run_us"] == pytest.approx(10.0)
    assert cache.stats(src)["trials"] == 4


def test_import_refuses_a_folder_that_is_no_database(tmp_path: Path):
    from farm.core.errors import UsageError

    with pytest.raises(UsageError, match="database_workload.json"):
        cache.import_log(open_store("memory://"), tmp_path, resolve_profile("cpu-local"))


def _edit_log(src: Path, dst: Path, edit) -> None:
    """Copy a JSONDatabase, passing each tuning record line (parsed) through `edit`, which
    returns a list of lines (parsed or raw strings) to write in its place."""
    import json
    import shutil

    dst.mkdir(parents=True)
    shutil.copy(src / "database_workload.json", dst / "database_workload.json")
    out = []
    for line in (src / "database_tuning_record.json").read_text().splitlines():
        for row in edit(json.loads(line)):
            out.append(row if isinstance(row, str) else json.dumps(row))
    (dst / "database_tuning_record.json").write_text("\n".join(out) + "\n")


def test_import_checks_every_record_and_says_what_it_refused(tmp_path: Path):
    """A poisoned or foreign log: impossible times, a trace of another workload, another
    target, lines that are no JSON. Each is refused with its reason; the rest is taken."""
    import copy

    profile = resolve_profile("cpu-local")
    src = open_store("memory://")
    seed_store(src, profile, 16, [30.0])
    cache.export(src, tmp_path / "log")

    def edit(row):
        good = row
        zero = copy.deepcopy(row)
        zero[1][1] = [0.0]
        negative = copy.deepcopy(row)
        negative[1][1] = [-1e-6]
        no_time = copy.deepcopy(row)
        no_time[1][1] = []
        wrong_trace = copy.deepcopy(row)
        wrong_trace[1][0][0][0][2][0] = "NO_SUCH_BLOCK"  # GetSBlock of a block it lacks
        other_target = copy.deepcopy(row)
        other_target[1][2] = {**row[1][2], "mcpu": "cortex-a76",
                              "mtriple": "aarch64-linux-gnu"}
        other_target[1][0][0][2][1][2] = 8  # another split: another candidate
        fake = copy.deepcopy(row)
        fake[1][1] = [1e-9]  # 0.001 us: finite and > 0, taken, but unverified
        fake[1][0][0][2][1][2] = 4
        return [good, zero, negative, no_time, wrong_trace, other_target, fake,
                "{not json", [7, row[1]]]

    _edit_log(tmp_path / "log", tmp_path / "bad", edit)
    dst = open_store("memory://")
    got = cache.import_log(dst, tmp_path / "bad", profile)
    assert got.new == 2 and got.workloads == 1
    reasons = dict(got.refused)
    assert reasons.pop("run times not finite and > 0") == 3
    assert reasons.pop("its trace does not apply to its workload") == 1
    assert reasons.pop("not JSON") == 1
    assert reasons.pop("its workload is missing or unreadable") == 1
    (target_reason, n), = reasons.items()
    assert n == 1 and "--retarget" in target_reason
    (wk,) = dst.workload_keys()
    assert dst.best(wk) is None and dst.unverified_count(wk) == 2
    # --retarget files the foreign record under the profile's target
    again = cache.import_log(dst, tmp_path / "bad", profile, retarget=True)
    assert again.new == 1 and again.known == 2
    moved = [r for r in dst.records(wk) if r.record[2].get("mcpu") is None]
    assert len(moved) == 3  # every stored record carries the profile's target


def test_rm_forgets_a_source_or_a_workload(tmp_path: Path):
    profile = resolve_profile("cpu-local")
    store = open_store("memory://")
    wk = seed_store(store, profile, 16, [30.0, 10.0, 20.0])
    cache.export(store, tmp_path / "log")
    other = seed_store(store, profile, 8, [5.0])
    assert store.best(wk).run_us == pytest.approx(10.0)
    assert cache.remove(store, [], source="seed") == {"workloads": 0, "records": 4}
    assert store.best(wk) is None and store.record_count(wk) == 0
    cache.import_log(store, tmp_path / "log", profile)
    assert cache.remove(store, [wk], source=f"import:{(tmp_path / 'log').resolve()}") == \
        {"workloads": 0, "records": 1}
    assert cache.remove(store, [wk, other]) == {"workloads": 2, "records": 0}
    assert store.workload_keys() == []


def test_rm_source_matches_whole_ids_only():
    """`farm cache rm --source j` removed every measured record: their source is "job", and any
    prefix matched. Now only a whole job id, host or source does (or a folder of imports)."""
    profile = resolve_profile("cpu-local")
    store = open_store("memory://")
    wk = seed_store(store, profile, 16, [30.0, 10.0])  # job_id "seed", source "job"
    assert cache.remove(store, [], source="j") == {"workloads": 0, "records": 0}
    assert cache.remove(store, [], source="see") == {"workloads": 0, "records": 0}
    assert store.record_count(wk) == 2
    assert cache.remove(store, [], source="seed") == {"workloads": 0, "records": 2}


def test_export_csv_has_a_row_per_measurement_for_pandas(tmp_path: Path):
    import csv
    import dataclasses

    from farm.client.table import TABLE, export_table

    profile = resolve_profile("cpu-local")
    store = open_store("memory://")
    wk = seed_store(store, profile, 16, [30.0, 10.0])
    failed = dataclasses.replace(
        store.records(wk)[0], candidate="f" * 32, run_us=None, error_class="runtime",
        error_msg="Traceback (most recent call last):\nRuntimeError: CL_OUT_OF_RESOURCES",
        phone="phone-a")
    store.add_record(failed)
    assert export_table(store, tmp_path / "t") == 3
    with open(tmp_path / "t" / "measurements.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert tuple(rows[0]) == TABLE and len(rows) == 3
    ok = sorted((r for r in rows if r["valid"] == "True"), key=lambda r: float(r["run_us"]))
    assert [float(r["run_us"]) for r in ok] == [10.0, 30.0]
    assert all(r["task"] == "matmul16" and r["device_key"] == "cpu-local" for r in rows)
    bad = next(r for r in rows if r["valid"] == "False")
    assert bad["error_class"] == "runtime" and bad["run_us"] == ""
    assert bad["error"] == "RuntimeError: CL_OUT_OF_RESOURCES"
    assert bad["phone"] == "phone-a" and {r["phone"] for r in ok} == {""}


def test_export_parquet_is_the_csv_typed(tmp_path: Path):
    """--format parquet: the same rows as the CSV's, with typed columns (a failure's run time
    null, the time a UTC timestamp), in row groups."""
    import dataclasses

    import pyarrow as pa
    import pyarrow.parquet as pq

    from farm.client import table

    store = open_store("memory://")
    wk = seed_store(store, resolve_profile("cpu-local"), 16, [30.0, 10.0, 20.0])
    store.add_record(dataclasses.replace(store.records(wk)[0], candidate="f" * 32, run_us=None,
                                         error_class="build", phone="phone-b",
                                         measured_at=1_796_000_000.5))
    old, table.ROW_GROUP = table.ROW_GROUP, 2  # 4 rows: two row groups
    try:
        assert table.export_table(store, tmp_path / "t", fmt="parquet") == 4
    finally:
        table.ROW_GROUP = old
    pf = pq.ParquetFile(tmp_path / "t" / "measurements.parquet")
    assert pf.metadata.num_row_groups == 2 and tuple(pf.schema_arrow.names) == table.TABLE
    assert pf.schema_arrow.field("run_us").type == pa.float64()
    assert pf.schema_arrow.field("measured_at").type == pa.timestamp("ms", tz="UTC")
    rows = pf.read().to_pylist()
    failed = [r for r in rows if not r["valid"]]
    assert len(failed) == 1 and failed[0]["run_us"] is None and failed[0]["gflops"] is None
    assert failed[0]["phone"] == "phone-b" and failed[0]["error_class"] == "build"
    assert sorted(r["run_us"] for r in rows if r["valid"]) == [10.0, 20.0, 30.0]
    assert failed[0]["measured_at"].timestamp() == 1_796_000_000.5
    assert all(r["measured_at"] is None for r in rows if r["valid"])  # seeded: time unknown


def test_export_parquet_without_pyarrow_says_how(tmp_path: Path, monkeypatch):
    import sys

    from farm.client.table import export_table
    from farm.core.errors import UsageError

    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    with pytest.raises(UsageError, match="pyarrow") as e:
        export_table(open_store("memory://"), tmp_path / "t", fmt="parquet")
    assert "tunefarm[export]" in (e.value.hint or "") and not (tmp_path / "t").exists()


def test_export_parquet_with_features_gives_each_cached_matrix(tmp_path: Path):
    """--features: each measurement's cost-model feature matrix where the store caches one
    (a list of rows, float32), null where it does not; refused without parquet."""
    import numpy as np
    import pyarrow.parquet as pq

    from farm.client.table import export_table
    from farm.core.errors import UsageError
    from workers.metaschedule.samples import encode

    store = open_store("memory://")
    wk = seed_store(store, resolve_profile("cpu-local"), 16, [30.0, 10.0])
    first, second = store.records(wk)
    matrix = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    store.put_features(wk, {first.candidate: encode(matrix)})
    assert export_table(store, tmp_path / "t", fmt="parquet", features=True) == 2
    rows = {r["candidate"]: r for r in pq.read_table(tmp_path / "t" / "measurements.parquet")
            .to_pylist()}
    assert np.allclose(rows[first.candidate]["features"], matrix)
    assert rows[second.candidate]["features"] is None
    with pytest.raises(UsageError, match="parquet"):
        export_table(store, tmp_path / "c", fmt="csv", features=True)
