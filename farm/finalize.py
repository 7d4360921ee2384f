"""Stage 6, finalize: the best record per workload -> one MetaSchedule JSONDatabase.

Plain TVM loads the result with `JSONDatabase(work_dir=...)`. Failed records
(run time 1e10) never make it into the log.
"""

from __future__ import annotations

import logging
from pathlib import Path

from farm.errors import StoreError
from farm.extract import load_mod
from farm.messages import TuneTask
from farm.store import RecordStore, StoredRecord

log = logging.getLogger(__name__)


def write_best_log(store: RecordStore, tasks: list[TuneTask],
                   work_dir: Path) -> dict[str, StoredRecord | None]:
    """Write `database_workload.json` + `database_tuning_record.json`; return the best per key."""
    from tvm.s_tir.meta_schedule.database import JSONDatabase, TuningRecord

    work_dir.mkdir(parents=True, exist_ok=True)
    db = JSONDatabase(work_dir=str(work_dir), module_equality="structural")
    bests: dict[str, StoredRecord | None] = {}
    for task in tasks:
        best = store.best(task.workload_key)
        if best is None or not best.valid:
            log.warning("finalize: %s (%s) has no valid record", task.name, task.workload_key)
            bests[task.workload_key] = None
            continue
        workload = db.commit_workload(load_mod(task))
        try:
            db.commit_tuning_record(TuningRecord.from_json(best.record, workload))
        except Exception as e:  # noqa: BLE001
            raise StoreError(f"best record {best.candidate} cannot be read back: {e}",
                             subject=f"workload {task.workload_key}") from e
        bests[task.workload_key] = best
    # Make sure both files exist even when nothing was tuned.
    for name in ("database_workload.json", "database_tuning_record.json"):
        (work_dir / name).touch()
    return bests
