"""Stage 6, finalize: the best record per workload -> one MetaSchedule JSONDatabase.

Finalize happens once per job: `finalize_job` fixes the job's choice (the best
valid record of each workload at that moment) in the store with a set-once key,
whoever gets there first (the worker that ends the last task, the submitting
client, `farm wait` or `farm resume`). Everyone after reads the same choice, so
every log written for the job is the same. Plain TVM loads the log with
`JSONDatabase(work_dir=...)`. Failed records (run time 1e10) never make it into it.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from farm.core.aliases import TVMDatabase
from farm.core.errors import StoreError, last_line
from farm.core.failures import fix_for
from farm.core.messages import JobSpec, TuneTask
from farm.core.traces import check_trace
from farm.store import StoredRecord, TaskState
from farm.store.jobs import JobReader
from farm.store.store import RecordReader, RecordsAndJobs, best_of
from farm.tir.blocknames import translate
from farm.tir.module import load_mod, tuning_record

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Unmeasured:
    """The tasks of a job that phones measured without one valid result."""

    tasks: list[str]  # their names
    searched: int  # tasks whose candidates went to phones at all
    error_class: str = ""  # the commonest failure over those tasks
    error: str = ""  # its first message (the phone's or builder's own words)

    @property
    def nothing(self) -> bool:
        """No task that went to the phones got one valid measurement: the job failed."""
        return self.searched > 0 and len(self.tasks) == self.searched

    def line(self, key: str = "KEY", tracker: str = "HOST:PORT") -> str:
        """One line: the commonest error and its fix."""
        return (f"{self.error_class}: {self.error or '(no message)'}; fix: "
                f"{fix_for(self.error_class, self.error, key, tracker)}")


def unmeasured(job: JobSpec, states: dict[str, TaskState]) -> Unmeasured:
    """Which tasks the phones measured without one valid result (a task from the store, or
    never sent to a phone, is not searched)."""
    names, searched, classes = [], 0, Counter[str]()
    errors: dict[str, str] = {}
    for wk in job.workload_keys:
        st = states.get(wk)
        if st is None or st.valid + sum(st.failures.values()) + st.device_lost == 0:
            continue
        searched += 1
        if st.valid == 0:
            names.append(job.task_names.get(wk, wk))
            classes.update(st.failures)
            classes["device_lost"] += st.device_lost
            for cls, text in st.errors.items():
                errors.setdefault(cls, text)
    cls = classes.most_common(1)[0][0] if classes else ""
    return Unmeasured(tasks=names, searched=searched, error_class=cls, error=errors.get(cls, ""))


def job_finished(store: JobReader, job: JobSpec) -> bool:
    """Every task of the job is done, exhausted or failed (and the job was not cancelled)."""
    if store.job_status(job.job_id).get("state") == "cancelled":
        return False
    states = store.task_states(job.job_id)
    return all(wk in states and states[wk].terminal for wk in job.workload_keys)


def trusted_best(store: RecordReader, wk: str) -> StoredRecord | None:
    """The best valid record a phone of this farm measured with this TVM: the store's best,
    unless that one was timed by another TVM version (then the best of those that were not)."""
    from tvm import __version__ as tvm_version

    best = store.best(wk)
    if best is None or not best.valid:
        return None
    if best.trusted(tvm_version):
        return best
    return best_of([r for r in store.records(wk) if r.trusted(tvm_version)])


def finalize_job(store: RecordsAndJobs, job: JobSpec, by: str) -> dict[str, str]:
    """The job's final choice, workload key -> candidate hash; fixed by the first caller."""
    picks = {}
    for wk in job.workload_keys:
        best = trusted_best(store, wk)
        if best is not None:
            picks[wk] = best.candidate
    final, first = store.finalize_once(job.job_id, picks)
    if first:
        verdict = unmeasured(job, store.task_states(job.job_id))
        store.set_job_status(job.job_id, state="failed" if verdict.nothing else "finalized",
                             finalized_by=by, finalized_at=str(time.time()),
                             message=f"no task got one valid measurement: "
                                     f"{verdict.line(job.device_key)}"
                             if verdict.nothing else "")
        log.info("job %s finalized by %s: %d of %d workloads have a best record", job.job_id,
                 by, len(final), len(job.workload_keys))
    return final


def write_best_log(store: RecordReader, tasks: list[TuneTask], work_dir: Path,
                   picks: dict[str, str],
                   unusable: dict[str, str] | None = None) -> dict[str, StoredRecord | None]:
    """Write `database_workload.json` + `database_tuning_record.json` with the picked record of
    each task; return the record per workload key (None: no valid record, or one that does not
    apply to the task: `unusable` gets why, and the task compiles with TVM's default schedule
    rather than the whole job failing at its end)."""
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    work_dir.mkdir(parents=True, exist_ok=True)
    db = JSONDatabase(work_dir=str(work_dir), module_equality="structural")
    bests: dict[str, StoredRecord | None] = {}
    for task in tasks:
        cand = picks.get(task.workload_key)
        best = store.get_record(task.workload_key, cand) if cand else None
        if cand and best is None:
            raise StoreError(f"the final record {cand} is missing from the store",
                             subject=f"workload {task.workload_key}",
                             hint="the store lost records; `farm resume JOB` tunes it again")
        bests[task.workload_key] = None
        if best is None or not best.valid:
            log.warning("finalize: %s (%s) has no valid record", task.name, task.workload_key)
            continue
        try:
            _commit(db, store, task, best)
        except Exception as e:  # noqa: BLE001 - one record, not the job's whole result
            why = f"its best record {best.candidate} does not apply: {last_line(e)}"
            log.warning("finalize: %s (%s): %s", task.name, task.workload_key, why)
            if unusable is not None:
                unusable[task.workload_key] = why
            continue
        bests[task.workload_key] = best
    # Make sure both files exist even when nothing was tuned.
    for name in ("database_workload.json", "database_tuning_record.json"):
        (work_dir / name).touch()
    return bests


def _commit(db: TVMDatabase, store: RecordReader, task: TuneTask, best: StoredRecord) -> None:
    """The record, tuned on the store's module of the workload, renamed to the task's blocks
    (the same operator can carry other block names in another model) and committed."""
    check_trace(best.record)  # the store can be written by others: read before any parse
    mod = load_mod(task)
    tuned_on = store.get_workload(task.workload_key)
    record = best.record if tuned_on is None else translate(best.record, load_mod(tuned_on), mod)
    db.commit_tuning_record(tuning_record(record, db.commit_workload(mod)))
