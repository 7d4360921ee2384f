"""The store interface and the logic that does not depend on where records live.

Contract of every `RecordStore`'s records (`RecordReader`, `RecordWriter`; tested once in
tests/unit/test_store_*.py and run against each implementation):

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
from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from farm.core.aliases import JsonList
from farm.core.errors import StoreError
from farm.core.messages import TuneTask, _Message
from farm.store.candidates import DEFAULT_SCHEDULE, candidate_hash  # noqa: F401 - re-exported
from farm.store.coordination import Coordination
from farm.store.hosts import HostRegistry
from farm.store.jobs import (  # noqa: F401 - re-exported: the store's whole vocabulary
    COUNTERS,
    MEASURE_COUNTERS,
    ROUND_COUNTERS,
    JobReader,
    JobWriter,
    TaskState,
    counts_of,
    total_counts,
    updated,
)
from farm.store.learned import LearnedStore
from farm.store.phones import PhoneLedger
from farm.store.spool import Spool

if TYPE_CHECKING:
    from farm.store.cold import Archive

log = logging.getLogger(__name__)

HOT_RECORDS = 32  # whole records a workload keeps in Redis (the fastest); the rest: archive
FAILED_RUN_SECS = 1e10  # what MetaSchedule stores as the run time of a failed candidate
# device_lost is never stored (the candidate is measured again), unless the same candidate lost
# a phone CULPRIT_AFTER times: then it is stored as the "culprit" and never measured again.
FAILURE_CLASSES = ("build", "runtime", "timeout", "wrong_answer", "device_lost", "culprit")
CULPRIT_AFTER = 3
@dataclass(frozen=True)
class StoredRecord(_Message):
    """One measured candidate of one workload, as the store keeps it.

    `record` is MetaSchedule's TuningRecord JSON ([trace, run_secs, target, args_info]),
    so any record can be turned back into a `TuningRecord` for a JSONDatabase.
    """

    kind = "stored record"
    workload_key: str
    candidate: str
    record: JsonList
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
    # the host and compilers that built the kernel ("<host>: LLVM <v>, <linker> <v>"; a lent
    # round's are its helper's, workers/metaschedule/identity.py); "" unknown (imported, or older)
    builder: str = ""
    # the phone that timed it (its RPC server's address as the tracker gave it, or its
    # emulated name); "" unknown (imported, a failure before a phone, or older)
    phone: str = ""

    @property
    def valid(self) -> bool:
        return self.run_us is not None and self.error_class is None

    def trusted(self, tvm_version: str = "") -> bool:
        """Measured by a phone of the farm with this TVM version (or an unknown one)."""
        return self.verified and not (tvm_version and self.tvm and self.tvm != tvm_version)


@dataclass(frozen=True)
class Entry:
    """One measured candidate as the store keeps every one of them (in tens of bytes: the
    whole record of most candidates is in the archive, farm/store/cold.py)."""

    candidate: str
    run_us: float | None  # None for a failed kernel
    error_class: str | None
    verified: bool
    tvm: str
    measured_at: float

    @property
    def valid(self) -> bool:
        return self.run_us is not None and self.error_class is None

    def trusted(self, tvm_version: str = "") -> bool:
        """As StoredRecord.trusted."""
        return self.verified and not (tvm_version and self.tvm and self.tvm != tvm_version)

    @classmethod
    def of(cls, rec: StoredRecord) -> Entry:
        return cls(rec.candidate, rec.run_us if rec.valid else None, rec.error_class,
                   rec.verified, rec.tvm, rec.measured_at)


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


class RecordReader(Protocol):
    """Workloads and their measured records, read (see the module docstring for the
    contract); the archive behind them (farm/store/cold.py) when the store has one."""

    archive: Archive | None = None  # where whole records that left Redis are (cold.py)

    @abstractmethod
    def get_workload(self, wk: str) -> TuneTask | None: ...

    @abstractmethod
    def workload_keys(self) -> list[str]: ...

    @abstractmethod
    def has_candidate(self, wk: str, candidate: str) -> bool: ...

    @abstractmethod
    def records(self, wk: str) -> list[StoredRecord]:
        """The whole records the store keeps hot: the workload's K fastest (failures leave
        first), its best, and records of an older layout; corrupt ones are logged with their
        key and skipped. Every record, archive included: farm/store/cold.all_records."""

    @abstractmethod
    def whole(self, wk: str, candidates: Collection[str]) -> dict[str, StoredRecord]:
        """The whole records among `candidates` that the store keeps hot (only those are
        read and parsed); the others are in the archive (farm/store/cold.wholes)."""

    @abstractmethod
    def entries(self, wk: str) -> list[Entry]:
        """Every candidate ever measured for the workload (whole record or not)."""

    @abstractmethod
    def entry(self, wk: str, candidate: str) -> Entry | None:
        """One candidate's entry (None when it was never stored)."""

    @abstractmethod
    def get_record(self, wk: str, candidate: str) -> StoredRecord | None:
        """One whole record by its candidate hash: hot, or from the archive when the store
        was opened with one (None when absent or corrupt)."""

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
    def best_candidates(self, workloads: list[str]) -> dict[str, str]:
        """The candidate of each workload's best (of those that have one); no record read."""

    @abstractmethod
    def exhausted(self, wk: str) -> bool:
        """True when every candidate MetaSchedule can generate for `wk` is in the store."""


class RecordWriter(Protocol):
    """What changes workloads and their records (see the module docstring for the
    contract: idempotent commits, keep-best atomic with them): a round's commits
    (workers/metaschedule/callback.py), `farm cache import` and `rm`, a job's advance."""

    @abstractmethod
    def put_workload(self, task: TuneTask, job_id: str = "") -> bool:
        """Remember a workload (first writer wins). True when it was new."""

    @abstractmethod
    def add_record(self, rec: StoredRecord) -> bool:
        """Commit a record; keep the best atomically. False when the candidate was stored."""

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


class StoreHealth(Protocol):
    """The store itself: reachable, writable, its memory."""

    @abstractmethod
    def ping(self) -> None:
        """Raise ServiceError when the store is unreachable or not writable."""

    def full(self) -> str | None:
        """Why the store refuses every write now (its memory limit reached), or None."""
        return None

    def memory(self) -> tuple[int, int] | None:
        """(bytes used, the limit; 0: none), or None where the store does not say."""
        return None

    def memory_at_start(self) -> int:
        """Bytes the store's server uses holding nothing (Redis's own), 0 where unknown."""
        return 0


class RecordStore(RecordReader, RecordWriter, Spool, JobReader, JobWriter, Coordination,
                  HostRegistry, LearnedStore, PhoneLedger, StoreHealth, ABC):
    """The whole store: records, read and written (here), the spool to the archive
    (farm/store/spool.py), jobs, read and written (farm/store/jobs.py), coordination
    (farm/store/coordination.py), hosts (farm/store/hosts.py), the cost models
    (farm/store/learned.py), the phones' ledger (farm/store/phones.py) and its health (here);
    one contract each (a `typing.Protocol` of at most 15 methods), one implementation on
    Redis and one in memory. Typed where a store is opened and closed (the CLI's commands, a
    worker's main, the embedded farm) and where a round uses nearly all of it; every other
    caller takes the contract it uses, or a named combination of them (below)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""


# --- named combinations of the contracts: what a caller that needs several of them takes. A
# contract is a Protocol, so a combination is one too and RecordStore needs not list it. ---
class ArchivedRecords(RecordReader, Spool, Coordination, Protocol):
    """Records hot and archived: reading every record of a workload drains the spool into the
    archive first, under its lease (farm/store/cold.py). Taken by cold.py, `farm cache show`
    and `export --all` (farm/client/cache.py) and a round's own cost model
    (workers/metaschedule/costmodel.pretrained_cost_model)."""


class JobRecords(RecordReader, JobReader, Protocol):
    """Records and jobs, read: what the archive's retention keeps (farm/store/retention.py)
    and a job's advance weighs (farm/jobs/advance.py)."""


class FarmView(ArchivedRecords, JobRecords, HostRegistry, PhoneLedger, StoreHealth, Protocol):
    """The farm as it is shown or weighed: records (with the archive), jobs, hosts, phones and
    the store's memory; writes no record, job or cost model. Taken by `farm status`, the
    client's job views and a waiting job's live view (farm/client/, farm/pipeline/wait.py),
    the report (farm/pipeline/report.py, summary.py), `farm cache stats` and `archive`, a
    host's metrics and heartbeat (workers/host/), and a round's hand-off and lending
    decisions (workers/round/handoff.py, lend/phone_side.py, measure.py)."""


class RecordsAndJobs(ArchivedRecords, JobRecords, RecordWriter, JobWriter, Protocol):
    """Records and jobs, read and written (with the archive and coordination): what moves a
    job on or writes records outside a round. Taken by a job's advance and finalize
    (farm/jobs/), the supervisor, a round's failure on its worker (workers/host/app.py), a
    job's cancel, `farm cache import` and `rm`."""


class RoundCommits(RecordWriter, JobWriter, PhoneLedger, Protocol):
    """What a round writes as its batches are measured: the records, the job's counters and
    the phones' spans. Taken by the round's StoreCallback (workers/metaschedule/callback.py)."""


class ModelStore(ArchivedRecords, RecordWriter, LearnedStore, Protocol):
    """A device key's cost models: trained on the records of its workloads (hot and archived),
    their features cached and families indexed (`put_workload`). Taken by
    workers/metaschedule/ (costmodel.py, samples.py, transfer.py, search.round_search), a
    round's search set-up (workers/round/tuning.py), a helper host's search sessions
    (workers/round/lend/helper_side.py) and the table export with features
    (farm/client/table.py)."""


def parse_record(raw: str | bytes, where: str) -> StoredRecord | None:
    """A stored record, or None (logged with its key) when it is corrupt."""
    try:
        return StoredRecord.loads(raw)
    except Exception as e:  # noqa: BLE001 - bad data must never crash a worker
        log.warning("store: corrupt record at %s skipped: %s", where, e)
        return None
