"""The store on Redis: thin I/O (records: records.py; the atomic keep-best is
keep_best.lua)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, TypedDict

import redis

from farm.core import keys
from farm.core.aliases import RedisClient, RedisScript
from farm.core.config import redact
from farm.core.errors import ServiceError, StoreError
from farm.core.messages import JobSpec
from farm.store.hosts import HostBeat
from farm.store.redis import url as redis_url
from farm.store.redis.errors import translate_errors
from farm.store.redis.phones import RedisPhoneLedger
from farm.store.redis.records import KEEP_BEST, REMOVE, RedisRecords, Replicas, lua_script
from farm.store.redis.spool import RedisSpool
from farm.store.store import HOT_RECORDS, RecordStore, TaskState, counts_of

if TYPE_CHECKING:
    from farm.store.cold import Archive
    from farm.store.features import LocalFeatures

_RELEASE_LEASE = lua_script("release_lease.lua")
_LEASE = lua_script("lease.lua")
_FINISH_ROUND = lua_script("finish_round.lua")
_UNSPOOL = lua_script("unspool.lua")


class _State(TypedDict):
    """What a pickled RedisStore keeps (its clients are made again on first use)."""

    url: str
    hot_records: int
    archive: Archive | None
    local_features: LocalFeatures | None


@translate_errors
class RedisStore(RedisRecords, RedisSpool, RecordStore, RedisPhoneLedger):
    """A `RecordStore` on one Redis database. Drops its clients when pickled. Its records:
    farm/store/redis/records.py, its spool: spool.py; `hot_records` whole records per
    workload stay in Redis, the others go to `archive` (farm/store/cold.py)."""

    def __init__(self, url: str, hot_records: int = HOT_RECORDS,
                 archive: Archive | None = None, local_features: LocalFeatures | None = None):
        self.url = url
        self.hot_records = hot_records
        self.archive = archive
        self.local_features = local_features
        self._zdict_cache = {}
        self._replicas = Replicas()
        self._client: redis.Redis | None = None
        self._bytes: redis.Redis | None = None
        self._script: RedisScript = None  # the scripts: registered with the client (`r`)
        self._lease: RedisScript = None
        self._release: RedisScript = None
        self._finish: RedisScript = None
        self._remove: RedisScript = None
        self._unspool: RedisScript = None

    def __getstate__(self) -> _State:
        return {"url": self.url, "hot_records": self.hot_records, "archive": self.archive,
                "local_features": self.local_features}

    def __setstate__(self, state: _State) -> None:
        self.__init__(state["url"], state["hot_records"], state["archive"],  # type: ignore[misc]
                      state["local_features"])

    def _connect(self, decode: bool) -> RedisClient:
        return redis_url.client(self.url, decode)

    @property
    def rb(self) -> RedisClient:
        """A client whose replies are bytes: packed records, compressed texts."""
        if self._bytes is None:
            self._bytes = self._connect(False)
        return self._bytes

    @property
    def r(self) -> RedisClient:
        """The client (decode_responses: every reply is str, which redis-py's own types do not
        say, hence `RedisClient`)."""
        if self._client is None:
            client = self._connect(True)
            self._script = client.register_script(KEEP_BEST)
            self._lease = client.register_script(_LEASE)
            self._release = client.register_script(_RELEASE_LEASE)
            self._finish = client.register_script(_FINISH_ROUND)
            self._remove = client.register_script(REMOVE)
            self._unspool = client.register_script(_UNSPOOL)
            # published last: another thread that sees the client finds its scripts too
            self._client = client
        return self._client

    def publish_host(self, beat: HostBeat, ttl_s: float) -> None:
        self.r.set(keys.host(beat.name), beat.dumps(), ex=max(1, round(ttl_s)))

    def remove_host(self, name: str) -> None:
        self.r.delete(keys.host(name))

    def hosts(self) -> list[HostBeat]:
        out = []
        for key in sorted(self.r.scan_iter(match=keys.host_pattern(), count=100)):
            raw = self.r.get(key)
            if raw is None:  # expired meanwhile
                continue
            try:
                out.append(HostBeat.loads(raw))
            except (StoreError, AttributeError, TypeError):  # a bad heartbeat is shown, not fatal
                out.append(HostBeat(name=str(key), tracker="?", phones={}))
        return out

    def ping(self) -> None:
        try:
            self.r.ping()
            self.r.set(keys.key_for("ping"), str(time.time()))
        except redis.RedisError as e:
            raise ServiceError(f"Redis is not reachable or not writable: {e}",
                               subject=redact(self.url),
                               hint="check it with `redis-cli -u URL ping`, or unset "
                                    "FARM_BROKER_URL to use the embedded farm") from e

    def memory(self) -> tuple[int, int] | None:
        info = self.r.info("memory")
        return int(info.get("used_memory") or 0), int(info.get("maxmemory") or 0)

    def memory_at_start(self) -> int:
        return int(self.r.info("memory").get("used_memory_startup") or 0)

    def full(self) -> str | None:
        info = self.r.info("memory")
        limit, used = int(info.get("maxmemory") or 0), int(info.get("used_memory") or 0)
        # Redis counts a command's own arguments too: a store this close to its limit
        # refuses the writes of rounds (records of a few KB) and of the job's end
        if limit and used >= 0.98 * limit and info.get("maxmemory_policy") == "noeviction":
            return (f"Redis {redact(self.url)} holds {used} bytes, its maxmemory is {limit}: "
                    "it refuses writes (it evicts nothing)")
        return None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._bytes is not None:
            self._bytes.close()
            self._bytes = None

    # --- jobs ----------------------------------------------------------------
    def put_job(self, spec: JobSpec) -> None:
        self.r.set(keys.job(spec.job_id), spec.dumps())
        self.r.zadd(keys.jobs_index(), {spec.job_id: spec.created_at or time.time()})

    def get_job(self, job_id: str) -> JobSpec | None:
        raw = self.r.get(keys.job(job_id))
        return None if raw is None else JobSpec.loads(raw)

    def job_ids(self) -> list[str]:
        return list(self.r.zrange(keys.jobs_index(), 0, -1))

    def set_task_state(self, job_id: str, wk: str, state: TaskState) -> None:
        self.r.hset(keys.job_tasks(job_id), wk, state.dumps())

    def task_states(self, job_id: str) -> dict[str, TaskState]:
        out = {}
        for wk, raw in self.r.hgetall(keys.job_tasks(job_id)).items():
            try:
                out[wk] = TaskState.loads(raw)
            except Exception:  # noqa: BLE001 - reported, never fatal
                out[wk] = TaskState(state="queued", message=f"corrupt state at {keys.job_tasks(job_id)}")
        return out

    def job_measured(self, job_id: str) -> dict[str, int]:
        return {k: int(v) for k, v in self.r.hgetall(keys.job_measured(job_id)).items()}

    def set_job_status(self, job_id: str, **fields: str) -> None:
        self.r.hset(keys.job_status(job_id), mapping=fields)

    def job_status(self, job_id: str) -> dict[str, str]:
        return dict(self.r.hgetall(keys.job_status(job_id)))

    def allocate(self, job_id: str, trials: int, budget: int) -> int:
        key = keys.job_allocated(job_id)
        total = int(self.r.incrby(key, trials))
        over = max(0, total - budget)
        if over:
            self.r.decrby(key, min(over, trials))
        return max(0, trials - over)

    def _take(self, key: str, owner: str, ttl_s: float, dead_holder: str = "") -> str | None:
        self.r  # noqa: B018 - make sure the scripts are registered
        holder = self._lease(keys=[key], args=[owner, max(1, int(ttl_s * 1000)), dead_holder])
        return holder or None

    def acquire_lease(self, wk: str, owner: str, ttl_s: float) -> str | None:
        return self._take(keys.lease(wk), owner, ttl_s)

    def release_lease(self, wk: str, owner: str) -> None:
        self.r  # noqa: B018
        self._release(keys=[keys.lease(wk)], args=[owner])

    # --- rounds ---------------------------------------------------------------
    def acquire_round(self, logical_id: str, owner: str, ttl_s: float,
                      dead_holder: str = "") -> str | None:
        return self._take(keys.round_lease(logical_id), owner, ttl_s, dead_holder)

    def release_round(self, logical_id: str, owner: str) -> None:
        self.r  # noqa: B018
        self._release(keys=[keys.round_lease(logical_id)], args=[owner])

    def round_holder(self, logical_id: str) -> str | None:
        return self.r.get(keys.round_lease(logical_id))

    def round_holders(self, logical_ids: list[str]) -> list[str | None]:
        return list(self.r.mget([keys.round_lease(i) for i in logical_ids])) if logical_ids else []

    def finish_round(self, logical_id: str, owner: str) -> bool:
        self.r  # noqa: B018 - make sure the scripts are registered
        return bool(self._finish(keys=[keys.round_lease(logical_id), keys.round_done(logical_id)],
                                 args=[owner, str(time.time()), keys.JOB_TTL_S]))

    def round_is_done(self, logical_id: str) -> bool:
        return bool(self.r.exists(keys.round_done(logical_id)))

    def round_started(self, logical_id: str) -> int:
        key = keys.round_starts(logical_id)
        pipe = self.r.pipeline()
        pipe.hincrby(key, "starts", 1)
        pipe.hget(key, "ends")
        pipe.expire(key, keys.JOB_TTL_S)
        starts, ends, _ = pipe.execute()
        return int(starts) - 1 - int(ends or 0)

    def round_ended(self, logical_id: str) -> None:
        self.r.hincrby(keys.round_starts(logical_id), "ends", 1)

    def round_tunings(self, logical_id: str, add: int = 0) -> int:
        key = keys.round_starts(logical_id)
        pipe = self.r.pipeline()
        pipe.hincrby(key, "tunings", add)
        pipe.expire(key, keys.JOB_TTL_S)
        return int(pipe.execute()[0]) - add

    # --- counters and the supervisor ------------------------------------------
    def count_measurements(self, job_id: str, wk: str, **counts: int) -> None:
        pipe = self.r.pipeline()
        for name, n in counts.items():
            if n:
                pipe.hincrby(keys.job_counts(job_id), f"{wk}|{name}", n)
        pipe.execute()

    def job_counts(self, job_id: str) -> dict[str, dict[str, int]]:
        return counts_of(self.r.hgetall(keys.job_counts(job_id)))

    def active_jobs(self) -> list[str]:
        return sorted(self.r.smembers(keys.active_jobs()))

    def set_active(self, job_id: str, active: bool) -> None:
        if active:
            self.r.sadd(keys.active_jobs(), job_id)
        else:
            self.r.srem(keys.active_jobs(), job_id)

    def claim_name(self, name: str, job_id: str) -> str | None:
        with self.r.pipeline() as pipe:
            while True:  # two submits of one name: the second sees the first's, or retries
                try:
                    pipe.watch(keys.job_names())
                    holder = pipe.hget(keys.job_names(), name)
                    if self.holds_name(holder, job_id):
                        return str(holder)
                    pipe.multi()
                    pipe.hset(keys.job_names(), name, job_id)
                    pipe.execute()
                    return None
                except redis.WatchError:
                    continue

    def job_named(self, name: str) -> str | None:
        return self.r.hget(keys.job_names(), name)

    def lead(self, owner: str, ttl_s: float) -> bool:
        return self._take(keys.supervisor(), owner, ttl_s) is None

    def finalize_once(self, job_id: str, picks: dict[str, str]) -> tuple[dict[str, str], bool]:
        first = bool(self.r.set(keys.job_final(job_id), json.dumps(picks, sort_keys=True), nx=True))
        return (dict(picks) if first else self.final_picks(job_id) or dict(picks)), first

    def final_picks(self, job_id: str) -> dict[str, str] | None:
        raw = self.r.get(keys.job_final(job_id))
        if raw is None:
            return None
        try:
            picks = json.loads(raw)
            if not isinstance(picks, dict):
                raise ValueError("not a JSON object")
            return {str(k): str(v) for k, v in picks.items()}
        except ValueError as e:
            raise StoreError(f"corrupt final choice: {e}", subject=keys.job_final(job_id),
                             hint=f"`farm resume {job_id}` finalizes the job again") from e

    def reset_job(self, job_id: str) -> None:
        self.r.delete(keys.job_final(job_id), keys.job_tasks(job_id), keys.job_measured(job_id),
                      keys.job_allocated(job_id), keys.job_status(job_id))

    def claim(self, key: str, ttl_s: float | None = None) -> bool:
        px = None if ttl_s is None else int(ttl_s * 1000)
        return bool(self.r.set(key, str(time.time()), nx=True, px=px))
