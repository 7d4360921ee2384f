"""An in-memory `RecordStore` for unit tests and dry runs (one process only)."""

from __future__ import annotations

import threading
import time

from farm.messages import JobSpec, TuneTask
from farm.store.store import RecordStore, StoredRecord, TaskState, is_better


class MemoryStore(RecordStore):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._workloads: dict[str, TuneTask] = {}
        self._records: dict[str, dict[str, StoredRecord]] = {}
        self._best: dict[str, StoredRecord] = {}
        self._jobs: dict[str, JobSpec] = {}
        self._tasks: dict[str, dict[str, TaskState]] = {}
        self._measured: dict[str, dict[str, int]] = {}
        self._status: dict[str, dict[str, str]] = {}
        self._flags: dict[str, float | None] = {}
        self._exhausted: dict[str, int] = {}
        self._leases: dict[str, tuple[str, float]] = {}
        self._allocated: dict[str, int] = {}
        self._final: dict[str, dict[str, str]] = {}
        self._lost: dict[tuple[str, str], int] = {}

    def ping(self) -> None:
        return None

    def put_workload(self, task: TuneTask, job_id: str = "") -> bool:
        with self._lock:
            if task.workload_key in self._workloads:
                return False
            self._workloads[task.workload_key] = task
            return True

    def get_workload(self, wk: str) -> TuneTask | None:
        return self._workloads.get(wk)

    def workload_keys(self) -> list[str]:
        return list(self._workloads)

    def add_record(self, rec: StoredRecord) -> bool:
        with self._lock:
            recs = self._records.setdefault(rec.workload_key, {})
            if rec.candidate in recs:
                return False
            recs[rec.candidate] = rec
            if rec.job_id:
                counts = self._measured.setdefault(rec.job_id, {})
                counts[rec.workload_key] = counts.get(rec.workload_key, 0) + 1
            cur = self._best.get(rec.workload_key)
            if rec.valid and is_better(rec.run_us, cur.run_us if cur else None):
                self._best[rec.workload_key] = rec
            return True

    def has_candidate(self, wk: str, candidate: str) -> bool:
        return candidate in self._records.get(wk, {})

    def records(self, wk: str) -> list[StoredRecord]:
        return list(self._records.get(wk, {}).values())

    def get_record(self, wk: str, candidate: str) -> StoredRecord | None:
        return self._records.get(wk, {}).get(candidate)

    def record_count(self, wk: str) -> int:
        return len(self._records.get(wk, {}))

    def best(self, wk: str) -> StoredRecord | None:
        return self._best.get(wk)

    def note_device_lost(self, wk: str, candidate: str) -> int:
        with self._lock:
            self._lost[(wk, candidate)] = self._lost.get((wk, candidate), 0) + 1
            return self._lost[(wk, candidate)]

    def mark_exhausted(self, wk: str, count: int) -> None:
        self._exhausted[wk] = count

    def exhausted(self, wk: str) -> bool:
        return wk in self._exhausted

    def put_job(self, spec: JobSpec) -> None:
        self._jobs[spec.job_id] = spec

    def get_job(self, job_id: str) -> JobSpec | None:
        return self._jobs.get(job_id)

    def job_ids(self) -> list[str]:
        return list(self._jobs)

    def set_task_state(self, job_id: str, wk: str, state: TaskState) -> None:
        with self._lock:
            self._tasks.setdefault(job_id, {})[wk] = state

    def task_states(self, job_id: str) -> dict[str, TaskState]:
        return dict(self._tasks.get(job_id, {}))

    def job_measured(self, job_id: str) -> dict[str, int]:
        return dict(self._measured.get(job_id, {}))

    def set_job_status(self, job_id: str, **fields: str) -> None:
        with self._lock:
            self._status.setdefault(job_id, {}).update(fields)

    def job_status(self, job_id: str) -> dict[str, str]:
        return dict(self._status.get(job_id, {}))

    def allocate(self, job_id: str, trials: int, budget: int) -> int:
        with self._lock:
            have = self._allocated.get(job_id, 0)
            grant = max(0, min(trials, budget - have))
            self._allocated[job_id] = have + grant
            return grant

    def acquire_lease(self, wk: str, owner: str, ttl_s: float) -> str | None:
        with self._lock:
            now = time.time()
            holder, expiry = self._leases.get(wk, (None, 0.0))
            if holder is not None and holder != owner and expiry > now:
                return holder
            self._leases[wk] = (owner, now + ttl_s)
            return None

    def release_lease(self, wk: str, owner: str) -> None:
        with self._lock:
            if self._leases.get(wk, (None, 0.0))[0] == owner:
                del self._leases[wk]

    def finalize_once(self, job_id: str, picks: dict[str, str]) -> tuple[dict[str, str], bool]:
        with self._lock:
            first = job_id not in self._final
            return dict(self._final.setdefault(job_id, dict(picks))), first

    def final_picks(self, job_id: str) -> dict[str, str] | None:
        found = self._final.get(job_id)
        return None if found is None else dict(found)

    def reset_job(self, job_id: str) -> None:
        with self._lock:
            for table in (self._final, self._tasks, self._measured, self._allocated,
                          self._status):
                table.pop(job_id, None)

    def claim(self, key: str, ttl_s: float | None = None) -> bool:
        with self._lock:
            now = time.time()
            expiry = self._flags.get(key, 0.0)
            if key in self._flags and (expiry is None or expiry > now):
                return False
            self._flags[key] = None if ttl_s is None else now + ttl_s
            return True
