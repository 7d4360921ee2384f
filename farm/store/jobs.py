"""The store's jobs, read (`JobReader`) and written (`JobWriter`): specs, each task's
state, the job's status and final choice, and the counters of its phone measurements.

Contract (tests/unit/test_store_*.py, every implementation):
- A task state is written whole and read back as written (last writer wins); states of
  unknown fields from older farms still load.
- `finalize_once` fixes a job's final choice once: the first caller's picks are kept, every
  later caller gets them back.
- The counters are atomic increments (many workers at once); `job_counts` has every name of
  COUNTERS, 0 where unset. `add_record` counts measurements, new and duplicates itself.
- `reset_job` forgets a job's progress but keeps its spec and its counters.
- A job's name (`farm submit --name`) is held by one running job at a time: `claim_name`
  takes it atomically, from no one or from a job that does not run; `job_named` reads it.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Protocol

from farm.core.aliases import JsonDict
from farm.core.errors import StoreError
from farm.core.messages import JobSpec, _Message

# what the store counts of every job's phone measurements (per workload): runs sent to a phone,
# of them new records, duplicates (the candidate was stored already: measured twice) and
# device_lost (the phone went away; measured again later). The proof of "nothing measured twice".
MEASURE_COUNTERS = ("measurements", "new", "duplicates", "device_lost")
# rounds run again (began tuning again, or lost before it began and sent again): atomic counts
ROUND_COUNTERS = ("retries",)
COUNTERS = MEASURE_COUNTERS + ROUND_COUNTERS


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
    # CPU seconds per part of its rounds, on phone hosts and on helper hosts (RoundResult's)
    cpu: dict[str, float] = field(default_factory=dict)
    helper_cpu: dict[str, float] = field(default_factory=dict)
    searched_by: list[str] = field(default_factory=list)  # helper hosts that searched its rounds
    updated_at: float = 0.0
    history: list[float] = field(default_factory=list)  # best us after each round
    # the task's outstanding round (RoundRequest JSON): queued or running. The supervisor
    # sends it again (a new attempt) when no copy of it is live.
    round: JsonDict = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        return self.state in ("done", "exhausted", "failed")

    @property
    def outstanding(self) -> bool:
        """Its round (`round`) is queued, waiting or running: the job goes on from there."""
        return self.state in ("queued", "tuning", "waiting")


def added(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """Two CPU accounts summed part by part (a task's rounds, a job's tasks)."""
    return {k: round(a.get(k, 0.0) + b.get(k, 0.0), 3) for k in sorted({*a, *b})}


class JobReader(Protocol):
    """Jobs and the state of their tasks, read (see the module docstring for the contract)."""

    @abstractmethod
    def get_job(self, job_id: str) -> JobSpec | None: ...

    def require_job(self, ref: str) -> JobSpec:
        """The job of id, or name (`farm submit --name`), `ref`; a StoreError that says how to
        find jobs when it is neither."""
        job = self.get_job(ref)
        if job is None and (named := self.job_named(ref)) is not None:
            job = self.get_job(named)
        if job is None:
            raise StoreError("no such job", subject=f"job {ref}",
                             hint="`farm status` lists jobs and their names")
        return job

    @abstractmethod
    def job_ids(self) -> list[str]: ...

    @abstractmethod
    def task_states(self, job_id: str) -> dict[str, TaskState]: ...

    @abstractmethod
    def job_measured(self, job_id: str) -> dict[str, int]:
        """Records each workload got from this job (counted by the keep-best commit)."""

    @abstractmethod
    def job_status(self, job_id: str) -> dict[str, str]: ...

    @abstractmethod
    def final_picks(self, job_id: str) -> dict[str, str] | None:
        """The job's final choice, or None when it has not been finalized."""

    @abstractmethod
    def job_counts(self, job_id: str) -> dict[str, dict[str, int]]:
        """Workload key -> {counter: count} (every counter of COUNTERS, 0 when unset)."""

    @abstractmethod
    def active_jobs(self) -> list[str]:
        """Jobs the supervisor looks after: dispatched, not yet finalized or cancelled."""

    @abstractmethod
    def job_named(self, name: str) -> str | None:
        """The id of the job `name` was last given to, or None."""

    def holds_name(self, holder: str | None, job_id: str) -> bool:
        """Whether `holder` (a name's job) keeps the name from `job_id`: another job that
        runs (not one that ended, nor one whose dispatch never finished)."""
        return bool(holder) and holder != job_id and \
            self.job_status(str(holder)).get("state") == "running"


class JobWriter(Protocol):
    """What moves jobs and their tasks on (see the module docstring for the contract): the
    dispatch, a round's worker, a job's advance and finalize, the supervisor, a cancel."""

    @abstractmethod
    def put_job(self, spec: JobSpec) -> None: ...

    @abstractmethod
    def set_task_state(self, job_id: str, wk: str, state: TaskState) -> None: ...

    @abstractmethod
    def set_job_status(self, job_id: str, **fields: str) -> None: ...

    @abstractmethod
    def finalize_once(self, job_id: str, picks: dict[str, str]) -> tuple[dict[str, str], bool]:
        """Fix the job's final choice (workload key -> candidate hash) once: the first caller's
        `picks` are kept, later callers get them back. Returns (the choice, True for the first
        caller). This is the job's finalize."""

    @abstractmethod
    def reset_job(self, job_id: str) -> None:
        """Forget a job's progress (final choice, task states, measured and budget counters,
        status), keep its spec and its measurement counters (`job_counts` covers every run):
        `farm resume` runs it again from the records in the store."""

    @abstractmethod
    def count_measurements(self, job_id: str, wk: str, **counts: int) -> None:
        """Add to the job's counters of `wk` (names in COUNTERS). `add_record` counts
        measurements, new and duplicates itself; the worker adds device_lost and retries."""

    @abstractmethod
    def set_active(self, job_id: str, active: bool) -> None: ...

    @abstractmethod
    def claim_name(self, name: str, job_id: str) -> str | None:
        """Give `name` to `job_id` unless another job holds it and has not ended (its id is
        returned, and the name stays with it); None when the name is `job_id`'s now."""


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


def updated(current: TaskState, **changes: object) -> TaskState:
    """`current` with `changes`, stamped now."""
    data = current.to_json()
    data.update(changes)
    data["updated_at"] = time.time()
    return TaskState.from_json(data)
