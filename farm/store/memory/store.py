"""An in-memory `RecordStore` for unit tests and dry runs (one process only): `MemoryStore`
keeps the records, jobs, coordination and hosts itself, and hands the spool (spool.py) and
the phones' ledger (phones.py) to its parts."""

from __future__ import annotations

import threading
import time
from collections.abc import Collection
from typing import TYPE_CHECKING

from farm.core.messages import JobSpec, TuneTask
from farm.store.cold import archived
from farm.store.hosts import HostBeat
from farm.store.learned import model_key
from farm.store.memory.phones import MemoryPhoneLedger
from farm.store.memory.spool import MemorySpool
from farm.store.phones import PhoneSpan, PhoneStat
from farm.store.spool import DRAIN_LEASE, SpoolBatch
from farm.store.store import (
    COUNTERS,
    HOT_RECORDS,
    Entry,
    RecordStore,
    StoredRecord,
    TaskState,
    best_of,
    check_run_us,
    is_better,
    on_phone,
)

if TYPE_CHECKING:
    from farm.store.cold import Archive


class MemoryStore(RecordStore):
    def __init__(self, hot_records: int = HOT_RECORDS, archive: Archive | None = None) -> None:
        self.hot_records = hot_records
        self.archive = archive
        self._lock = threading.Lock()
        self._spool = MemorySpool(self._lock, self._drainer)
        self._phones = MemoryPhoneLedger()
        self._workloads: dict[str, TuneTask] = {}
        self._records: dict[str, dict[str, StoredRecord]] = {}  # every one (entries)
        self._hot: dict[str, dict[str, float]] = {}  # wk -> candidate -> rank (as Redis)
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
        self._counts: dict[str, dict[str, dict[str, int]]] = {}
        self._rounds: dict[str, dict[str, int]] = {}  # logical id -> starts/ends
        self._active: set[str] = set()
        self._names: dict[str, str] = {}  # a job name (`farm submit --name`) -> its job
        self._hosts: dict[str, tuple[HostBeat, float]] = {}  # name -> (beat, expires at)
        self._model_workloads: dict[str, set[str]] = {}
        self._model_families: dict[str, dict[str, str]] = {}
        self._features: dict[str, dict[str, str]] = {}
        self._models: dict[str, dict[str, str]] = {}

    def publish_host(self, beat: HostBeat, ttl_s: float) -> None:
        with self._lock:
            self._hosts[beat.name] = (beat, time.monotonic() + ttl_s)

    def remove_host(self, name: str) -> None:
        with self._lock:
            self._hosts.pop(name, None)

    def hosts(self) -> list[HostBeat]:
        now = time.monotonic()
        with self._lock:
            return [b for _, (b, until) in sorted(self._hosts.items()) if until > now]

    def ping(self) -> None:
        return None

    def put_workload(self, task: TuneTask, job_id: str = "") -> bool:
        with self._lock:
            mkey = model_key(task.device_key, task.target)
            self._model_workloads.setdefault(mkey, set()).add(task.workload_key)
            if task.family:
                self._model_families.setdefault(mkey, {})[task.workload_key] = task.family
            if task.workload_key in self._workloads:
                return False
            self._workloads[task.workload_key] = task
            return True

    def model_workloads(self, mkey: str) -> list[str]:
        with self._lock:
            return sorted(self._model_workloads.get(mkey, set()))

    def model_families(self, mkey: str) -> dict[str, str]:
        with self._lock:
            return dict(self._model_families.get(mkey, {}))

    def put_features(self, wk: str, features: dict[str, str]) -> None:
        with self._lock:
            self._features.setdefault(wk, {}).update(features)

    def features(self, wk: str) -> dict[str, str]:
        with self._lock:
            return dict(self._features.get(wk, {}))

    def put_cost_model(self, mkey: str, fields: dict[str, str]) -> None:
        with self._lock:
            self._models[mkey] = dict(fields)

    def cost_model(self, mkey: str) -> dict[str, str]:
        with self._lock:
            return dict(self._models.get(mkey, {}))

    def get_workload(self, wk: str) -> TuneTask | None:
        return self._workloads.get(wk)

    def workload_keys(self) -> list[str]:
        return list(self._workloads)

    def add_record(self, rec: StoredRecord) -> bool:
        check_run_us(rec)
        with self._lock:
            recs = self._records.setdefault(rec.workload_key, {})
            old = recs.get(rec.candidate)
            # a phone of the farm measured a candidate stored unverified (or measured with
            # another TVM version): this measurement replaces it
            replaced = old is not None and rec.verified and not old.trusted(rec.tvm)
            new = old is None or replaced
            if rec.job_id and on_phone(rec):
                self._count(rec.job_id, rec.workload_key, measurements=1,
                            **{"new" if new else "duplicates": 1})
            if not new:
                return False
            recs[rec.candidate] = rec
            self._keep_hot(rec)
            if not rec.verified:
                return True  # never the best before a phone of the farm measured it
            if rec.job_id:
                counts = self._measured.setdefault(rec.job_id, {})
                counts[rec.workload_key] = counts.get(rec.workload_key, 0) + 1
            cur = self._best.get(rec.workload_key)
            if replaced and cur is not None and cur.candidate == rec.candidate:
                self._set_best(rec.workload_key)
            elif rec.valid and is_better(rec.run_us, cur.run_us if cur else None):
                self._best[rec.workload_key] = rec
            return True

    def _keep_hot(self, rec: StoredRecord) -> None:
        """As keep_best.lua: the K fastest stay whole (failures leave first), others spool."""
        hot = self._hot.setdefault(rec.workload_key, {})
        hot[rec.candidate] = rec.run_us if rec.valid else 1e18  # type: ignore[assignment]
        if len(hot) > max(1, self.hot_records):
            out = max(hot, key=lambda c: (hot[c], c))
            del hot[out]
            self._spool.push(self._records[rec.workload_key][out])

    def _set_best(self, wk: str) -> None:
        best = best_of(list(self._records.get(wk, {}).values()))
        if best is None:
            self._best.pop(wk, None)
        else:
            self._best[wk] = best

    def unverified_count(self, wk: str) -> int:
        return sum(1 for r in self._records.get(wk, {}).values() if not r.verified)

    def remove_records(self, wk: str, candidates: list[str]) -> int:
        with self._lock:
            recs = self._records.get(wk, {})
            removed = 0
            for cand in candidates:
                removed += recs.pop(cand, None) is not None
                self._hot.get(wk, {}).pop(cand, None)
                self._lost.pop((wk, cand), None)
            cur = self._best.get(wk)
            if cur is not None and cur.candidate in candidates:
                self._set_best(wk)
            return removed

    def remove_workload(self, wk: str) -> bool:
        with self._lock:
            existed = self._workloads.pop(wk, None) is not None
            self._records.pop(wk, None)
            self._hot.pop(wk, None)
            self._best.pop(wk, None)
            self._exhausted.pop(wk, None)
            self._features.pop(wk, None)
            for members in self._model_workloads.values():
                members.discard(wk)
            for families in self._model_families.values():
                families.pop(wk, None)
            for key in [k for k in self._lost if k[0] == wk]:
                del self._lost[key]
            return existed

    def has_candidate(self, wk: str, candidate: str) -> bool:
        return candidate in self._records.get(wk, {})

    def records(self, wk: str) -> list[StoredRecord]:
        recs = self._records.get(wk, {})
        out = [recs[c] for c in self._hot.get(wk, {}) if c in recs]
        best = self._best.get(wk)
        if best is not None and best.candidate not in self._hot.get(wk, {}):
            out.append(best)
        return out

    def whole(self, wk: str, candidates: Collection[str]) -> dict[str, StoredRecord]:
        hot = {r.candidate: r for r in self.records(wk)}
        return {c: hot[c] for c in candidates if c in hot}

    def entries(self, wk: str) -> list[Entry]:
        return [Entry.of(r) for r in self._records.get(wk, {}).values()]

    def entry(self, wk: str, candidate: str) -> Entry | None:
        rec = self._records.get(wk, {}).get(candidate)
        return None if rec is None else Entry.of(rec)

    def get_record(self, wk: str, candidate: str) -> StoredRecord | None:
        best = self._best.get(wk)
        if candidate in self._hot.get(wk, {}) or (best and best.candidate == candidate):
            return self._records.get(wk, {}).get(candidate)
        if self.archive is None:
            return None

        return archived(self, self.archive, wk, candidate)

    def record_count(self, wk: str) -> int:
        return len(self._records.get(wk, {})) - self.unverified_count(wk)

    def best(self, wk: str) -> StoredRecord | None:
        return self._best.get(wk)

    def best_candidates(self, workloads: list[str]) -> dict[str, str]:
        return {wk: b.candidate for wk in workloads if (b := self._best.get(wk)) is not None}

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

    def _take(self, key: str, owner: str, ttl_s: float, dead_holder: str = "") -> str | None:
        with self._lock:
            now = time.time()
            holder, expiry = self._leases.get(key, (None, 0.0))
            if (holder is not None and expiry > now and holder != owner
                    and not (dead_holder and holder == dead_holder)):
                return holder
            self._leases[key] = (owner, now + ttl_s)
            return None

    def _holder(self, key: str) -> str | None:
        holder, expiry = self._leases.get(key, (None, 0.0))
        return holder if holder is not None and expiry > time.time() else None

    def _drainer(self) -> str | None:
        """Who holds the spool's drain lease (acquire_lease of DRAIN_LEASE); `_lock` held."""
        return self._holder(f"wl:{DRAIN_LEASE}")

    def _give_back(self, key: str, owner: str) -> None:
        with self._lock:
            if self._leases.get(key, (None, 0.0))[0] == owner:
                del self._leases[key]

    def acquire_lease(self, wk: str, owner: str, ttl_s: float) -> str | None:
        return self._take(f"wl:{wk}", owner, ttl_s)

    def release_lease(self, wk: str, owner: str) -> None:
        self._give_back(f"wl:{wk}", owner)

    def acquire_round(self, logical_id: str, owner: str, ttl_s: float,
                      dead_holder: str = "") -> str | None:
        return self._take(f"round:{logical_id}", owner, ttl_s, dead_holder)

    def release_round(self, logical_id: str, owner: str) -> None:
        self._give_back(f"round:{logical_id}", owner)

    def round_holder(self, logical_id: str) -> str | None:
        return self._holder(f"round:{logical_id}")

    def finish_round(self, logical_id: str, owner: str) -> bool:
        with self._lock:
            holder = self._holder(f"round:{logical_id}")
            if holder is not None and holder != owner:
                return False
            self._flags[f"done:{logical_id}"] = None
            self._leases.pop(f"round:{logical_id}", None)
            return True

    def round_is_done(self, logical_id: str) -> bool:
        return f"done:{logical_id}" in self._flags

    def round_started(self, logical_id: str) -> int:
        with self._lock:
            seen = self._rounds.setdefault(logical_id, {"starts": 0, "ends": 0})
            seen["starts"] += 1
            return seen["starts"] - 1 - seen["ends"]

    def round_ended(self, logical_id: str) -> None:
        with self._lock:
            self._rounds.setdefault(logical_id, {"starts": 0, "ends": 0})["ends"] += 1

    def round_tunings(self, logical_id: str, add: int = 0) -> int:
        with self._lock:
            seen = self._rounds.setdefault(logical_id, {"starts": 0, "ends": 0})
            seen["tunings"] = seen.get("tunings", 0) + add
            return seen["tunings"] - add

    def _count(self, job_id: str, wk: str, **counts: int) -> None:
        row = self._counts.setdefault(job_id, {}).setdefault(
            wk, dict.fromkeys(COUNTERS, 0))
        for name, n in counts.items():
            row[name] += n

    def count_measurements(self, job_id: str, wk: str, **counts: int) -> None:
        with self._lock:
            self._count(job_id, wk, **counts)

    def job_counts(self, job_id: str) -> dict[str, dict[str, int]]:
        return {wk: dict(row) for wk, row in self._counts.get(job_id, {}).items()}

    def active_jobs(self) -> list[str]:
        return sorted(self._active)

    def set_active(self, job_id: str, active: bool) -> None:
        with self._lock:
            (self._active.add if active else self._active.discard)(job_id)

    def claim_name(self, name: str, job_id: str) -> str | None:
        with self._lock:
            if self.holds_name(holder := self._names.get(name), job_id):
                return holder
            self._names[name] = job_id
            return None

    def job_named(self, name: str) -> str | None:
        return self._names.get(name)

    def lead(self, owner: str, ttl_s: float) -> bool:
        return self._take("supervisor", owner, ttl_s) is None

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

    # --- the spool (Spool): spool.py ---------------------------------------------------------
    def spooled(self, n: int) -> SpoolBatch:
        return self._spool.spooled(n)

    def unspool(self, batch: SpoolBatch, owner: str) -> bool:
        return self._spool.unspool(batch, owner)

    def spool_size(self) -> int:
        return self._spool.spool_size()

    def dead_letters(self) -> int:
        return self._spool.dead_letters()

    # --- the phones' ledger (PhoneLedger): phones.py -----------------------------------------
    def note_phone_spans(self, spans: list[PhoneSpan]) -> None:
        self._phones.note_phone_spans(spans)

    def add_phone_work(self, key: str, phone: str, worker: str, seconds: float) -> None:
        self._phones.add_phone_work(key, phone, worker, seconds)

    def phone_lost(self, key: str, phone: str, at: float, window_s: float, limit: int,
                   aside_s: float) -> float:
        return self._phones.phone_lost(key, phone, at, window_s, limit, aside_s)

    def phone_heat(self, key: str, phone: str, us: float, at: float, share: float,
                   rest_s: float) -> tuple[bool, float, float]:
        return self._phones.phone_heat(key, phone, us, at, share, rest_s)

    def phone_stats(self) -> list[PhoneStat]:
        return self._phones.phone_stats()

    def job_phone_spans(self, job_id: str) -> list[PhoneSpan]:
        return self._phones.job_phone_spans(job_id)
