"""The store on Redis: `RedisStore`, the one `RecordStore` of this backend, made of parts that
share one connection (connection.py: the clients, the Lua scripts, the URL): the records
(records.py), the spool (spool.py), the jobs (jobs.py), coordination (coordination.py), the
hosts (hosts.py), the phones' ledger (phones.py) and the server's health (health.py).

Each of its methods hands the call to the part that keeps it. The parts are its own: a call
reaches them only through RedisStore, whose methods raise the farm's StoreUnavailable where
redis-py raised (errors.py), once; inside, the parts see redis-py's errors."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, TypedDict

from farm.core.aliases import RedisClient
from farm.core.messages import JobSpec, TuneTask
from farm.store.cold import archived
from farm.store.hosts import HostBeat
from farm.store.phones import PhoneSpan, PhoneStat
from farm.store.redis.connection import RedisConnection
from farm.store.redis.coordination import RedisCoordination
from farm.store.redis.errors import translate_errors
from farm.store.redis.health import RedisHealth
from farm.store.redis.hosts import RedisHosts
from farm.store.redis.jobs import RedisJobs
from farm.store.redis.phones import RedisPhoneLedger
from farm.store.redis.records import RedisRecords
from farm.store.redis.spool import RedisSpool
from farm.store.spool import SpoolBatch
from farm.store.store import HOT_RECORDS, Entry, RecordStore, StoredRecord, TaskState

if TYPE_CHECKING:
    from farm.store.cold import Archive
    from farm.store.features import LocalFeatures


class _State(TypedDict):
    """What a pickled RedisStore keeps (its clients are made again on first use)."""

    url: str
    hot_records: int
    archive: Archive | None
    local_features: LocalFeatures | None


@translate_errors
class RedisStore(RecordStore):
    """A `RecordStore` on one Redis database. Drops its clients when pickled. `hot_records`
    whole records per workload stay in Redis, the others go to `archive`
    (farm/store/cold.py); `local_features`: the host's file of cost-model features
    (farm/store/features.py), None: in Redis."""

    def __init__(self, url: str, hot_records: int = HOT_RECORDS,
                 archive: Archive | None = None, local_features: LocalFeatures | None = None):
        self.url = url
        self.hot_records = hot_records
        self.archive = archive
        self.local_features = local_features
        self._conn = RedisConnection(url)
        self._records = RedisRecords(self._conn, self._archived, hot_records, local_features)
        self._spool = RedisSpool(self._conn, self._records)
        self._jobs = RedisJobs(self._conn)
        self._coordination = RedisCoordination(self._conn)
        self._hosts = RedisHosts(self._conn)
        self._phones = RedisPhoneLedger(self._conn)
        self._health = RedisHealth(self._conn)

    def __getstate__(self) -> _State:
        return {"url": self.url, "hot_records": self.hot_records, "archive": self.archive,
                "local_features": self.local_features}

    def __setstate__(self, state: _State) -> None:
        self.__init__(state["url"], state["hot_records"], state["archive"],  # type: ignore[misc]
                      state["local_features"])

    def _archived(self, wk: str, candidate: str) -> StoredRecord | None:
        """A whole record from the archive (None without one), the spool drained into it
        first under the drain lease: the records part reads the archive through the whole
        store (farm/store/cold.archived)."""
        return None if self.archive is None else archived(self, self.archive, wk, candidate)

    @property
    def r(self) -> RedisClient:
        """The connection's client (replies as str): for tests and benches that look at Redis
        itself; the farm goes through the store's methods."""
        return self._conn.r

    @property
    def rb(self) -> RedisClient:
        """The connection's client whose replies are bytes (as `r`)."""
        return self._conn.rb

    def close(self) -> None:
        self._conn.close()

    # --- records (RecordReader, RecordWriter) and cost models (LearnedStore): records.py ---
    def put_workload(self, task: TuneTask, job_id: str = "") -> bool:
        return self._records.put_workload(task, job_id)

    def get_workload(self, wk: str) -> TuneTask | None:
        return self._records.get_workload(wk)

    def workload_keys(self) -> list[str]:
        return self._records.workload_keys()

    def model_workloads(self, mkey: str) -> list[str]:
        return self._records.model_workloads(mkey)

    def model_families(self, mkey: str) -> dict[str, str]:
        return self._records.model_families(mkey)

    def put_features(self, wk: str, features: dict[str, str]) -> None:
        self._records.put_features(wk, features)

    def features(self, wk: str) -> dict[str, str]:
        return self._records.features(wk)

    def put_cost_model(self, mkey: str, fields: dict[str, str]) -> None:
        self._records.put_cost_model(mkey, fields)

    def cost_model(self, mkey: str) -> dict[str, str]:
        return self._records.cost_model(mkey)

    def add_record(self, rec: StoredRecord) -> bool:
        return self._records.add_record(rec)

    def has_candidate(self, wk: str, candidate: str) -> bool:
        return self._records.has_candidate(wk, candidate)

    def records(self, wk: str) -> list[StoredRecord]:
        return self._records.records(wk)

    def whole(self, wk: str, candidates: Collection[str]) -> dict[str, StoredRecord]:
        return self._records.whole(wk, candidates)

    def entries(self, wk: str) -> list[Entry]:
        return self._records.entries(wk)

    def entry(self, wk: str, candidate: str) -> Entry | None:
        return self._records.entry(wk, candidate)

    def get_record(self, wk: str, candidate: str) -> StoredRecord | None:
        return self._records.get_record(wk, candidate)

    def record_count(self, wk: str) -> int:
        return self._records.record_count(wk)

    def unverified_count(self, wk: str) -> int:
        return self._records.unverified_count(wk)

    def remove_records(self, wk: str, candidates: list[str]) -> int:
        return self._records.remove_records(wk, candidates)

    def remove_workload(self, wk: str) -> bool:
        return self._records.remove_workload(wk)

    def best(self, wk: str) -> StoredRecord | None:
        return self._records.best(wk)

    def best_candidates(self, workloads: list[str]) -> dict[str, str]:
        return self._records.best_candidates(workloads)

    def note_device_lost(self, wk: str, candidate: str) -> int:
        return self._records.note_device_lost(wk, candidate)

    def mark_exhausted(self, wk: str, count: int) -> None:
        self._records.mark_exhausted(wk, count)

    def exhausted(self, wk: str) -> bool:
        return self._records.exhausted(wk)

    # --- the spool (Spool): spool.py -------------------------------------------------------
    def spooled(self, n: int) -> SpoolBatch:
        return self._spool.spooled(n)

    def unspool(self, batch: SpoolBatch, owner: str) -> bool:
        return self._spool.unspool(batch, owner)

    def spool_size(self) -> int:
        return self._spool.spool_size()

    def dead_letters(self) -> int:
        return self._spool.dead_letters()

    # --- jobs (JobReader, JobWriter): jobs.py ----------------------------------------------
    def put_job(self, spec: JobSpec) -> None:
        self._jobs.put_job(spec)

    def get_job(self, job_id: str) -> JobSpec | None:
        return self._jobs.get_job(job_id)

    def job_ids(self) -> list[str]:
        return self._jobs.job_ids()

    def set_task_state(self, job_id: str, wk: str, state: TaskState) -> None:
        self._jobs.set_task_state(job_id, wk, state)

    def task_states(self, job_id: str) -> dict[str, TaskState]:
        return self._jobs.task_states(job_id)

    def job_measured(self, job_id: str) -> dict[str, int]:
        return self._jobs.job_measured(job_id)

    def set_job_status(self, job_id: str, **fields: str) -> None:
        self._jobs.set_job_status(job_id, **fields)

    def job_status(self, job_id: str) -> dict[str, str]:
        return self._jobs.job_status(job_id)

    def count_measurements(self, job_id: str, wk: str, **counts: int) -> None:
        self._jobs.count_measurements(job_id, wk, **counts)

    def job_counts(self, job_id: str) -> dict[str, dict[str, int]]:
        return self._jobs.job_counts(job_id)

    def active_jobs(self) -> list[str]:
        return self._jobs.active_jobs()

    def set_active(self, job_id: str, active: bool) -> None:
        self._jobs.set_active(job_id, active)

    def claim_name(self, name: str, job_id: str) -> str | None:
        return self._jobs.claim_name(name, job_id)

    def job_named(self, name: str) -> str | None:
        return self._jobs.job_named(name)

    def finalize_once(self, job_id: str, picks: dict[str, str]) -> tuple[dict[str, str], bool]:
        return self._jobs.finalize_once(job_id, picks)

    def final_picks(self, job_id: str) -> dict[str, str] | None:
        return self._jobs.final_picks(job_id)

    def reset_job(self, job_id: str) -> None:
        self._jobs.reset_job(job_id)

    # --- coordination (Coordination): coordination.py ---------------------------------------
    def claim(self, key: str, ttl_s: float | None = None) -> bool:
        return self._coordination.claim(key, ttl_s)

    def allocate(self, job_id: str, trials: int, budget: int) -> int:
        return self._coordination.allocate(job_id, trials, budget)

    def acquire_lease(self, wk: str, owner: str, ttl_s: float) -> str | None:
        return self._coordination.acquire_lease(wk, owner, ttl_s)

    def release_lease(self, wk: str, owner: str) -> None:
        self._coordination.release_lease(wk, owner)

    def lead(self, owner: str, ttl_s: float) -> bool:
        return self._coordination.lead(owner, ttl_s)

    def acquire_round(self, logical_id: str, owner: str, ttl_s: float,
                      dead_holder: str = "") -> str | None:
        return self._coordination.acquire_round(logical_id, owner, ttl_s, dead_holder)

    def release_round(self, logical_id: str, owner: str) -> None:
        self._coordination.release_round(logical_id, owner)

    def round_holder(self, logical_id: str) -> str | None:
        return self._coordination.round_holder(logical_id)

    def round_holders(self, logical_ids: list[str]) -> list[str | None]:
        return self._coordination.round_holders(logical_ids)

    def finish_round(self, logical_id: str, owner: str) -> bool:
        return self._coordination.finish_round(logical_id, owner)

    def round_is_done(self, logical_id: str) -> bool:
        return self._coordination.round_is_done(logical_id)

    def round_started(self, logical_id: str) -> int:
        return self._coordination.round_started(logical_id)

    def round_ended(self, logical_id: str) -> None:
        self._coordination.round_ended(logical_id)

    def round_tunings(self, logical_id: str, add: int = 0) -> int:
        return self._coordination.round_tunings(logical_id, add)

    # --- hosts (HostRegistry): hosts.py -----------------------------------------------------
    def publish_host(self, beat: HostBeat, ttl_s: float) -> None:
        self._hosts.publish_host(beat, ttl_s)

    def remove_host(self, name: str) -> None:
        self._hosts.remove_host(name)

    def hosts(self) -> list[HostBeat]:
        return self._hosts.hosts()

    # --- the phones' ledger (PhoneLedger): phones.py ----------------------------------------
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

    # --- the server (StoreHealth): health.py ------------------------------------------------
    def ping(self) -> None:
        self._health.ping()

    def memory(self) -> tuple[int, int] | None:
        return self._health.memory()

    def memory_at_start(self) -> int:
        return self._health.memory_at_start()

    def full(self) -> str | None:
        return self._health.full()
