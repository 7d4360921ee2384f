"""The record store as a cache users can see and move: ls, show, stats, export, import.

Export writes a MetaSchedule JSONDatabase (the best record per workload); import
seeds the store from any JSONDatabase, e.g. a log tuned by another TVM user, for
one device key (whose profile gives the target the workload key is built from).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from farm.errors import StoreError, UsageError
from farm.extract import workload_key
from farm.finalize import write_best_log
from farm.messages import TuneTask
from farm.profiles import DeviceProfile
from farm.store import RecordStore, StoredRecord, candidate_hash
from farm.store.store import FAILED_RUN_SECS


def entries(store: RecordStore, device_key: str | None = None) -> list[dict[str, Any]]:
    out = []
    for wk in store.workload_keys():
        task = store.get_workload(wk)
        if task is None or (device_key and task.device_key != device_key):
            continue
        best = store.best(wk)
        out.append({"workload_key": wk, "name": task.name, "device_key": task.device_key,
                    "trials": store.record_count(wk),
                    "best_us": round(best.run_us, 3) if best and best.run_us else None,
                    "best_job": best.job_id if best else None})
    return out


def show(store: RecordStore, wk: str, top: int = 5) -> dict[str, Any]:
    task = store.get_workload(wk)
    if task is None:
        raise StoreError("no such workload in the store", subject=f"workload {wk}",
                         hint="`farm cache ls` lists them")
    records = store.records(wk)
    valid = sorted((r for r in records if r.valid), key=lambda r: r.run_us)  # type: ignore[arg-type,return-value]
    failures = Counter(r.error_class for r in records if not r.valid)
    return {
        "workload_key": wk, "name": task.name, "device_key": task.device_key,
        "target": task.target, "weight": task.weight, "trials": len(records),
        "valid": len(valid), "failures": dict(failures),
        "jobs": sorted({r.job_id for r in records if r.job_id}),
        "hosts": sorted({r.host for r in records if r.host}),
        "top": [{"candidate": r.candidate, "run_us": round(r.run_us, 3), "job_id": r.job_id,
                 "host": r.host} for r in valid[:top]],  # type: ignore[arg-type]
    }


def stats(store: RecordStore) -> dict[str, Any]:
    by_key: Counter = Counter()
    trials = 0
    valid = 0
    failures: Counter = Counter()
    for wk in store.workload_keys():
        task = store.get_workload(wk)
        by_key[task.device_key if task else "?"] += 1
        for r in store.records(wk):
            trials += 1
            if r.valid:
                valid += 1
            else:
                failures[r.error_class or "failed"] += 1
    return {"workloads": sum(by_key.values()), "trials": trials, "valid": valid,
            "failures": dict(failures), "workloads_by_device_key": dict(by_key),
            "jobs": len(store.job_ids())}


def export(store: RecordStore, out_dir: Path, device_key: str | None = None) -> int:
    tasks = [t for t in (store.get_workload(wk) for wk in store.workload_keys())
             if t is not None and (device_key is None or t.device_key == device_key)]
    picks = {t.workload_key: b.candidate for t in tasks
             if (b := store.best(t.workload_key)) is not None and b.valid}
    bests = write_best_log(store, tasks, out_dir, picks)
    return sum(1 for b in bests.values() if b is not None)


def import_log(store: RecordStore, log_dir: Path, profile: DeviceProfile,
               source: str = "import") -> tuple[int, int]:
    """Seed the store from a JSONDatabase folder. Returns (workloads, new records)."""
    import tvm
    import tvm_ffi
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    for name in ("database_workload.json", "database_tuning_record.json"):
        if not (log_dir / name).is_file():
            raise UsageError(f"not a MetaSchedule JSONDatabase: {name} is missing",
                             subject=str(log_dir))
    try:
        db = JSONDatabase(work_dir=str(log_dir), allow_missing=False)
        records = db.get_all_tuning_records()
    except Exception as e:  # noqa: BLE001
        raise StoreError(f"cannot read the JSONDatabase: {e}", subject=str(log_dir)) from e
    target = profile.target_json()
    workloads: set[str] = set()
    new = 0
    for rec in records:
        mod = rec.workload.mod
        wk = workload_key(tvm_ffi.structural_hash(mod), target, profile.key)
        if wk not in workloads:
            store.put_workload(TuneTask(
                name=f"imported:{_func_name(mod)}", workload_key=wk, weight=1,
                mod_json=tvm.ir.save_json(mod), target=target, device_key=profile.key), source)
            workloads.add(wk)
        data = rec.as_json()
        secs = [float(s) for s in (rec.run_secs or [])]
        failed = not secs or any(s >= FAILED_RUN_SECS for s in secs)
        stored = StoredRecord(
            workload_key=wk, candidate=candidate_hash(data), record=data,
            run_us=None if failed else sum(secs) / len(secs) * 1e6,
            error_class="runtime" if failed else None, job_id=source, host="import",
            measured_at=time.time())
        new += int(store.add_record(stored))
    return len(workloads), new


def _func_name(mod: Any) -> str:
    names = [gv.name_hint for gv in mod.get_global_vars()]
    return names[0] if names else "main"
