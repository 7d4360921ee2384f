"""The record store on Redis: thin I/O; the atomic keep-best is keep_best.lua."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import redis

from farm.core import keys
from farm.core.config import redact
from farm.core.errors import ServiceError, StoreError
from farm.core.messages import JobSpec, TuneTask
from farm.store.hosts import HostBeat
from farm.store.learned import model_key
from farm.store.phones import RedisPhoneLedger
from farm.store.store import (
    RecordStore,
    StoredRecord,
    TaskState,
    check_run_us,
    counts_of,
    on_phone,
    parse_record,
)


def _lua(name: str) -> str:
    return Path(__file__).with_name(name).read_text()


_BEST = _lua("best.lua")  # shared functions, prepended to the scripts that keep the best
_KEEP_BEST = _BEST + _lua("keep_best.lua")
_REMOVE = _BEST + _lua("remove_records.lua")
_RELEASE_LEASE = _lua("release_lease.lua")
_LEASE = _lua("lease.lua")
_FINISH_ROUND = _lua("finish_round.lua")




class RedisStore(RecordStore, RedisPhoneLedger):
    """A `RecordStore` on one Redis database. Drops its client when pickled."""

    def __init__(self, url: str):
        self.url = url
        self._client: redis.Redis | None = None
        self._script: Any = None
        self._lease: Any = None
        self._release: Any = None
        self._finish: Any = None
        self._remove: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"])  # type: ignore[misc]

    @property
    def r(self) -> Any:
        """The client (decode_responses: every reply is str, which redis-py's own types do not
        say, hence Any)."""
        if self._client is None:
            client = redis.Redis.from_url(
                self.url, decode_responses=True, socket_connect_timeout=5,
                socket_timeout=30, health_check_interval=10, retry_on_timeout=True,
            )
            self._script = client.register_script(_KEEP_BEST)
            self._lease = client.register_script(_LEASE)
            self._release = client.register_script(_RELEASE_LEASE)
            self._finish = client.register_script(_FINISH_ROUND)
            self._remove = client.register_script(_REMOVE)
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

    # --- workloads and records ---------------------------------------------
    def put_workload(self, task: TuneTask, job_id: str = "") -> bool:
        self.r.sadd(keys.model_workloads(model_key(task.device_key, task.target)),
                    task.workload_key)
        new = bool(self.r.hsetnx(keys.workload(task.workload_key), "task", task.dumps()))
        if new:
            self.r.hset(keys.workload(task.workload_key),
                        mapping={"first_job": job_id, "created_at": str(time.time())})
            self.r.zadd(keys.workload_index(), {task.workload_key: time.time()}, nx=True)
        return new

    def get_workload(self, wk: str) -> TuneTask | None:
        raw = self.r.hget(keys.workload(wk), "task")
        return None if raw is None else TuneTask.loads(raw)

    def workload_keys(self) -> list[str]:
        return list(self.r.zrange(keys.workload_index(), 0, -1))

    def model_workloads(self, mkey: str) -> list[str]:
        return sorted(self.r.smembers(keys.model_workloads(mkey)))

    def put_features(self, wk: str, features: dict[str, str]) -> None:
        if features:
            self.r.hset(keys.features(wk), mapping=features)

    def features(self, wk: str) -> dict[str, str]:
        return dict(self.r.hgetall(keys.features(wk)))

    def put_cost_model(self, mkey: str, fields: dict[str, str]) -> None:
        pipe = self.r.pipeline(transaction=True)
        pipe.delete(keys.cost_model(mkey))
        if fields:
            pipe.hset(keys.cost_model(mkey), mapping=fields)
        pipe.execute()

    def cost_model(self, mkey: str) -> dict[str, str]:
        return dict(self.r.hgetall(keys.cost_model(mkey)))

    def add_record(self, rec: StoredRecord) -> bool:
        check_run_us(rec)
        self.r  # noqa: B018 - make sure the script is registered
        run_us = "" if not rec.valid else repr(float(rec.run_us))  # type: ignore[arg-type]
        measured_key = keys.job_measured(rec.job_id) if rec.job_id else ""
        counts_key = keys.job_counts(rec.job_id) if rec.job_id else ""
        try:
            return bool(self._script(
                keys=[keys.records(rec.workload_key), keys.best(rec.workload_key), measured_key,
                      counts_key, keys.unverified(rec.workload_key)],
                args=[rec.candidate, rec.dumps(), run_us, rec.workload_key,
                      "1" if on_phone(rec) else "0",
                      "1" if rec.verified else "0", rec.tvm],
            ))
        except redis.exceptions.OutOfMemoryError as e:
            raise StoreError(f"the store is full (Redis maxmemory reached, it evicts nothing): "
                             f"{e}", subject=f"{redact(self.url)}, workload {rec.workload_key}",
                             hint="records so far are kept; raise maxmemory (FARM_REDIS_MAXMEMORY "
                                  "or redis.conf), then `farm resume` the job") from e
        except redis.exceptions.ResponseError as e:  # after OOM: its subclass
            if "refused" not in str(e):
                raise
            raise StoreError(str(e), subject=f"record {rec.candidate} of workload "
                                             f"{rec.workload_key}") from e

    def has_candidate(self, wk: str, candidate: str) -> bool:
        return bool(self.r.hexists(keys.records(wk), candidate))

    def records(self, wk: str) -> list[StoredRecord]:
        out = []
        for cand, raw in self.r.hgetall(keys.records(wk)).items():
            rec = parse_record(raw, f"{keys.records(wk)}[{cand}]")
            if rec is not None:
                out.append(rec)
        return out

    def get_record(self, wk: str, candidate: str) -> StoredRecord | None:
        raw = self.r.hget(keys.records(wk), candidate)
        return None if raw is None else parse_record(raw, f"{keys.records(wk)}[{candidate}]")

    def record_count(self, wk: str) -> int:
        # no MULTI: a full Redis (noeviction) refuses a transaction, even of reads
        pipe = self.r.pipeline(transaction=False)
        pipe.hlen(keys.records(wk))
        pipe.scard(keys.unverified(wk))
        total, unverified = pipe.execute()
        return int(total) - int(unverified)

    def unverified_count(self, wk: str) -> int:
        return int(self.r.scard(keys.unverified(wk)))

    def remove_records(self, wk: str, candidates: list[str]) -> int:
        if not candidates:
            return 0
        self.r  # noqa: B018
        return int(self._remove(keys=[keys.records(wk), keys.best(wk), keys.unverified(wk),
                                      keys.device_lost(wk)], args=list(candidates)))

    def remove_workload(self, wk: str) -> bool:
        task = self.get_workload(wk)
        pipe = self.r.pipeline(transaction=True)
        pipe.delete(keys.workload(wk), keys.records(wk), keys.best(wk), keys.unverified(wk),
                    keys.device_lost(wk), keys.features(wk))
        pipe.zrem(keys.workload_index(), wk)
        if task is not None:
            pipe.srem(keys.model_workloads(model_key(task.device_key, task.target)), wk)
        deleted, *_ = pipe.execute()
        return int(deleted) > 0

    def best(self, wk: str) -> StoredRecord | None:
        raw = self.r.hget(keys.best(wk), "record")
        return None if raw is None else parse_record(raw, keys.best(wk))

    def note_device_lost(self, wk: str, candidate: str) -> int:
        return int(self.r.hincrby(keys.device_lost(wk), candidate, 1))

    def mark_exhausted(self, wk: str, count: int) -> None:
        self.r.hset(keys.workload(wk), "exhausted_at", str(count))

    def exhausted(self, wk: str) -> bool:
        return self.r.hget(keys.workload(wk), "exhausted_at") is not None

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
