"""The store interface and the logic that does not depend on where records live.

Contract of every `RecordStore` (tested once in tests/unit/test_store_contract.py
and run against each implementation):

- Thread and process safe: many workers commit to one store at once.
- `add_record` is idempotent: a candidate (workload key + candidate hash) is
  stored once; a second commit of it returns False and changes nothing. Keep-best
  is atomic with the insert, so the best record is always one of the records.
- Records never expire. A corrupt record is reported with its key and skipped.
- A valid record's run time is finite and > 0 (`check_run_us`); anything else is refused
  with a StoreError, by every implementation (the Redis script checks it again).
- Every record says where it came from (`source`, `job_id`, `host`, `tvm`, its target in
  `record`). An imported record is unverified (`verified=False`): it warms the search and
  the cost model, but it is never the best (so never a job's final choice) and is not
  counted by `record_count`, until a phone of the farm measures that candidate; that
  measurement replaces it. The same holds for a record measured with another TVM version.
"""

from __future__ import annotations

import logging
import math
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from farm.core.errors import StoreError
from farm.core.messages import JobSpec, TuneTask, _Message
from farm.store.candidates import DEFAULT_SCHEDULE, candidate_hash  # noqa: F401 - re-exported
from farm.store.hosts import HostBeat
from farm.store.learned import LearnedStore
from farm.store.phones import PhoneLedger

log = logging.getLogger(__name__)

FAILED_RUN_SECS = 1e10  # what MetaSchedule stores as the run time of a failed candidate
# device_lost is never stored (the candidate is measured again), unless the same candidate lost
# a phone CULPRIT_AFTER times: then it is stored as the "culprit" and never measured again.
FAILURE_CLASSES = ("build", "runtime", "timeout", "wrong_answer", "device_lost", "culprit")
CULPRIT_AFTER = 3
# what the store counts of every job's phone measurements (per workload): runs sent to a phone,
# of them new records, duplicates (the candidate was stored already: measured twice) and
# device_lost (the phone went away; measured again later). The proof of "nothing measured twice".
MEASURE_COUNTERS = ("measurements", "new", "duplicates", "device_lost")
# rounds run again (began tuning again, or lost before it began and sent again): atomic counts
ROUND_COUNTERS = ("retries",)
COUNTERS = MEASURE_COUNTERS + ROUND_COUNTERS


@dataclass(frozen=True)
class StoredRecord(_Message):
    """One measured candidate of one workload, as the store keeps it.

    `record` is MetaSchedule's TuningRecord JSON ([trace, run_secs, target, args_info]),
    so any record can be turned back into a `TuningRecord` for a JSONDatabase.
    """

    kind = "stored record"
    workload_key: str
    candidate: str
    record: list[Any]
    run_us: float | None  # mean run time; None for a failed kernel
    error_class: str | None = None  # one of FAILURE_CLASSES, None when valid
    error_msg: str = ""
    job_id: str = ""
    host: str = ""
    measured_at: float = 0.0
    # provenance: "job" (measured by a round of `job_id` on a phone of the farm) or
    # "import:<where>" (`farm cache import`); the TVM version that built and timed it
    source: str = "job"
    tvm: str = ""
    verified: bool = True  # measured by a phone of the farm (False: imported, unverified)

    @property
    def valid(self) -> bool:
        return self.run_us is not None and self.error_class is None

    def trusted(self, tvm_version: str = "") -> bool:
        """Measured by a phone of the farm with this TVM version (or an unknown one)."""
        return self.verified and not (tvm_version and self.tvm and self.tvm != tvm_version)


def valid_secs(secs: object) -> bool:
    """The store's one rule for a run time (seconds): a number, finite, > 0 and below
    MetaSchedule's failure mark. keep_best.lua applies the same rule in Redis."""
    return (not isinstance(secs, bool) and isinstance(secs, int | float)
            and math.isfinite(secs) and 0 < secs < FAILED_RUN_SECS)


def check_run_us(rec: StoredRecord) -> None:
    """A valid record's run time follows `valid_secs`; raises StoreError naming the record
    otherwise."""
    us = rec.run_us
    if us is None:
        return
    if isinstance(us, bool) or not isinstance(us, int | float) or not valid_secs(us / 1e6):
        raise StoreError(f"run time {us!r} us is not a finite number > 0: refused",
                         subject=f"record {rec.candidate} of workload {rec.workload_key}",
                         hint="a phone or an imported log reported an impossible time")


def on_phone(rec: StoredRecord) -> bool:
    """Was this record measured on a phone of the farm? (A build error never reached one; an
    imported record was measured elsewhere.)"""
    return rec.verified and rec.error_class != "build"


def is_better(new_us: float | None, best_us: float | None) -> bool:
    """Is a record of `new_us` better than the best so far? Failed records never are."""
    if new_us is None or math.isnan(new_us) or new_us >= FAILED_RUN_SECS * 1e6:
        return False
    return best_us is None or new_us < best_us


def best_of(records: list[StoredRecord]) -> StoredRecord | None:
    """The best verified valid record of a list (what the store keeps as the best)."""
    best = None
    for rec in records:
        if rec.valid and rec.verified and is_better(rec.run_us, best.run_us if best else None):
            best = rec
    return best


@dataclass(frozen=True)
class TaskState(_Message):
    """The state of one workload within one job (written by workers, read by status)."""

    kind = "task state"
    state: str = "queued"  # queued | waiting | tuning | ready | done | exhausted | failed
    rounds: int = 0
    host: str = ""
    best_us: float | None = None
    message: str = ""
    failures: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # class -> the job's first message
    valid: int = 0  # valid measurements of this job, over all rounds
    device_lost: int = 0
    measure_s: float = 0.0  # seconds its batches spent on the phones, over all rounds
    single_schedule: bool = False  # one possible schedule: measured once, never searched
    updated_at: float = 0.0
    history: list[float] = field(default_factory=list)  # best us after each round
    # the task's outstanding round (RoundRequest JSON): queued or running. The supervisor
    # sends it again (a new attempt) when no copy of it is live.
    round: dict[str, Any] = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        return self.state in ("done", "exhausted", "failed")

    @property
    def outstanding(self) -> bool:
        """Its round (`round`) is queued, waiting or running: the job goes on from there."""
        return self.state in ("queued", "tuning", "waiting")


class RecordStore(LearnedStore, PhoneLedger, ABC):
    """Where every measurement lives. See the module docstring (and farm/store/learned.py's)
    for the contract."""

    # --- workloads and records -------------------------------------------
    @abstractmethod
    def put_workload(self, task: TuneTask, job_id: str = "") -> bool:
        """Remember a workload (first writer wins). True when it was new."""

    @abstractmethod
    def get_workload(self, wk: str) -> TuneTask | None: ...

    @abstractmethod
    def workload_keys(self) -> list[str]: ...

    @abstractmethod
    def add_record(self, rec: StoredRecord) -> bool:
        """Commit a record; keep the best atomically. False when the candidate was stored."""

    @abstractmethod
    def has_candidate(self, wk: str, candidate: str) -> bool: ...

    @abstractmethod
    def records(self, wk: str) -> list[StoredRecord]:
        """Every record of a workload; corrupt ones are logged with their key and skipped."""

    @abstractmethod
    def get_record(self, wk: str, candidate: str) -> StoredRecord | None:
        """One stored record by its candidate hash (None when absent or corrupt)."""

    @abstractmethod
    def record_count(self, wk: str) -> int:
        """Records measured by the farm's phones (unverified imports are not counted)."""

    @abstractmethod
    def unverified_count(self, wk: str) -> int:
        """Imported records no phone of the farm has measured yet."""

    @abstractmethod
    def best(self, wk: str) -> StoredRecord | None:
        """The best verified valid record (an unverified one never is)."""

    @abstractmethod
    def remove_records(self, wk: str, candidates: list[str]) -> int:
        """Delete records (atomic with the best: it is recomputed when removed). Returns
        how many were deleted."""

    @abstractmethod
    def remove_workload(self, wk: str) -> bool:
        """Forget a workload and every record of it. True when it existed."""

    @abstractmethod
    def note_device_lost(self, wk: str, candidate: str) -> int:
        """Count one more phone lost while measuring this candidate; returns the count so far
        (over every round, host and job)."""

    @abstractmethod
    def mark_exhausted(self, wk: str, count: int) -> None:
        """Remember that the search space of `wk` has no more than `count` distinct candidates."""

    @abstractmethod
    def exhausted(self, wk: str) -> bool:
        """True when every candidate MetaSchedule can generate for `wk` is in the store."""

    # --- jobs -------------------------------------------------------------
    @abstractmethod
    def put_job(self, spec: JobSpec) -> None: ...

    @abstractmethod
    def get_job(self, job_id: str) -> JobSpec | None: ...

    def require_job(self, job_id: str) -> JobSpec:
        """The job's spec, or a StoreError that says how to find job ids."""
        job = self.get_job(job_id)
        if job is None:
            raise StoreError("no such job", subject=f"job {job_id}",
                             hint="`farm status` lists jobs")
        return job

    @abstractmethod
    def job_ids(self) -> list[str]: ...

    @abstractmethod
    def set_task_state(self, job_id: str, wk: str, state: TaskState) -> None: ...

    @abstractmethod
    def task_states(self, job_id: str) -> dict[str, TaskState]: ...

    @abstractmethod
    def job_measured(self, job_id: str) -> dict[str, int]:
        """Records each workload got from this job (counted by the keep-best commit)."""

    @abstractmethod
    def set_job_status(self, job_id: str, **fields: str) -> None: ...

    @abstractmethod
    def job_status(self, job_id: str) -> dict[str, str]: ...

    @abstractmethod
    def finalize_once(self, job_id: str, picks: dict[str, str]) -> tuple[dict[str, str], bool]:
        """Fix the job's final choice (workload key -> candidate hash) once: the first caller's
        `picks` are kept, later callers get them back. Returns (the choice, True for the first
        caller). This is the job's finalize."""

    @abstractmethod
    def final_picks(self, job_id: str) -> dict[str, str] | None:
        """The job's final choice, or None when it has not been finalized."""

    @abstractmethod
    def reset_job(self, job_id: str) -> None:
        """Forget a job's progress (final choice, task states, measured and budget counters,
        status), keep its spec and its measurement counters (`job_counts` covers every run):
        `farm resume` runs it again from the records in the store."""

    @abstractmethod
    def claim(self, key: str, ttl_s: float | None = None) -> bool:
        """Set a once-only flag (round done, next round sent, finalize). True for the first caller."""

    @abstractmethod
    def allocate(self, job_id: str, trials: int, budget: int) -> int:
        """Reserve up to `trials` of the job's budget (atomic); returns the trials granted."""

    @abstractmethod
    def acquire_lease(self, wk: str, owner: str, ttl_s: float) -> str | None:
        """Take (or renew) the workload's lease for `owner`. None when taken; else the holder."""

    @abstractmethod
    def release_lease(self, wk: str, owner: str) -> None:
        """Give the lease back if `owner` holds it."""

    # --- rounds: fenced, at most one copy runs, none after it is done -------
    @abstractmethod
    def acquire_round(self, logical_id: str, owner: str, ttl_s: float,
                      dead_holder: str = "") -> str | None:
        """Take (or renew) the round's lease for `owner` (atomic). `dead_holder`: a holder known
        to be dead whose lease may be taken over. None when `owner` holds it now; else the holder."""

    @abstractmethod
    def release_round(self, logical_id: str, owner: str) -> None:
        """Give the round's lease back if `owner` holds it."""

    @abstractmethod
    def round_holder(self, logical_id: str) -> str | None:
        """Who runs the round now (its lease), or None."""

    @abstractmethod
    def finish_round(self, logical_id: str, owner: str) -> bool:
        """The round ran to its end: no later copy of it runs. Only `owner` holding its lease
        (or nobody) may say so, and the lease is released in the same atomic step; False
        when another copy holds it (this copy's result must not move the job on)."""

    @abstractmethod
    def round_is_done(self, logical_id: str) -> bool: ...

    @abstractmethod
    def round_started(self, logical_id: str) -> int:
        """Count a start of the round; returns how many earlier starts never ended (each
        killed its process: a poison round after a few)."""

    @abstractmethod
    def round_ended(self, logical_id: str) -> None:
        """Count an end of the round (it returned or raised: its process survived)."""

    @abstractmethod
    def round_tunings(self, logical_id: str, add: int = 0) -> int:
        """Copies of the round that began tuning before `add` more are counted."""

    # --- measurement counters and the supervisor ---------------------------
    @abstractmethod
    def count_measurements(self, job_id: str, wk: str, **counts: int) -> None:
        """Add to the job's counters of `wk` (names in COUNTERS). `add_record` counts
        measurements, new and duplicates itself; the worker adds device_lost and retries."""

    @abstractmethod
    def job_counts(self, job_id: str) -> dict[str, dict[str, int]]:
        """Workload key -> {counter: count} (every counter of COUNTERS, 0 when unset)."""

    @abstractmethod
    def active_jobs(self) -> list[str]:
        """Jobs the supervisor looks after: dispatched, not yet finalized or cancelled."""

    @abstractmethod
    def set_active(self, job_id: str, active: bool) -> None: ...

    @abstractmethod
    def lead(self, owner: str, ttl_s: float) -> bool:
        """Take or renew the supervisor's leader lock; True while `owner` leads."""

    # -- worker hosts: each advertises itself with an expiring heartbeat --
    @abstractmethod
    def publish_host(self, beat: HostBeat, ttl_s: float) -> None:
        """A host's heartbeat, gone after `ttl_s` unless published again."""

    @abstractmethod
    def remove_host(self, name: str) -> None: ...

    @abstractmethod
    def hosts(self) -> list[HostBeat]:
        """Every live host's heartbeat, by name; an unreadable one as a placeholder (the
        tracker "?"), so a bad heartbeat is seen rather than hidden."""

    @abstractmethod
    def ping(self) -> None:
        """Raise ServiceError when the store is unreachable or not writable."""

    def full(self) -> str | None:
        """Why the store refuses every write now (its memory limit reached), or None."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""


def total_counts(counts: dict[str, dict[str, int]]) -> dict[str, int]:
    """A job's counters summed over its workloads (every name of MEASURE_COUNTERS)."""
    return {name: sum(row.get(name, 0) for row in counts.values()) for name in MEASURE_COUNTERS}


def counts_of(raw: dict[str, str]) -> dict[str, dict[str, int]]:
    """The job's counter hash ("<wk>|<counter>" -> n) as workload key -> {counter: n}."""
    out: dict[str, dict[str, int]] = {}
    for field_name, value in raw.items():
        wk, _, name = field_name.rpartition("|")
        if name in COUNTERS:
            out.setdefault(wk, dict.fromkeys(COUNTERS, 0))[name] = int(value)
    return out


def parse_record(raw: str | bytes, where: str) -> StoredRecord | None:
    """A stored record, or None (logged with its key) when it is corrupt."""
    try:
        return StoredRecord.loads(raw)
    except Exception as e:  # noqa: BLE001 - bad data must never crash a worker
        log.warning("store: corrupt record at %s skipped: %s", where, e)
        return None


def updated(current: TaskState, **changes: Any) -> TaskState:
    """`current` with `changes`, stamped now."""
    data = current.to_json()
    data.update(changes)
    data["updated_at"] = time.time()
    return TaskState.from_json(data)
