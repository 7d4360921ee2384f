"""The jobs on Redis (the contract: farm/store/jobs.py): specs, each task's state, a job's
status, counters, name and final choice. `RedisJobs`, a part of RedisStore (store.py), on the
store's connection (connection.py)."""

from __future__ import annotations

import json
import time

import redis

from farm.core import keys
from farm.core.errors import StoreError
from farm.core.messages import JobSpec
from farm.store.jobs import JobReader, JobWriter, TaskState, counts_of
from farm.store.redis.connection import RedisConnection


class RedisJobs(JobReader, JobWriter):
    """The jobs of RedisStore, read and written."""

    def __init__(self, conn: RedisConnection) -> None:
        self.conn = conn

    def put_job(self, spec: JobSpec) -> None:
        self.conn.r.set(keys.job(spec.job_id), spec.dumps())
        self.conn.r.zadd(keys.jobs_index(), {spec.job_id: spec.created_at or time.time()})

    def get_job(self, job_id: str) -> JobSpec | None:
        raw = self.conn.r.get(keys.job(job_id))
        return None if raw is None else JobSpec.loads(raw)

    def job_ids(self) -> list[str]:
        return list(self.conn.r.zrange(keys.jobs_index(), 0, -1))

    def set_task_state(self, job_id: str, wk: str, state: TaskState) -> None:
        self.conn.r.hset(keys.job_tasks(job_id), wk, state.dumps())

    def task_states(self, job_id: str) -> dict[str, TaskState]:
        out = {}
        for wk, raw in self.conn.r.hgetall(keys.job_tasks(job_id)).items():
            try:
                out[wk] = TaskState.loads(raw)
            except Exception:  # noqa: BLE001 - reported, never fatal
                out[wk] = TaskState(state="queued",
                                    message=f"corrupt state at {keys.job_tasks(job_id)}")
        return out

    def job_measured(self, job_id: str) -> dict[str, int]:
        return {k: int(v) for k, v in self.conn.r.hgetall(keys.job_measured(job_id)).items()}

    def set_job_status(self, job_id: str, **fields: str) -> None:
        self.conn.r.hset(keys.job_status(job_id), mapping=fields)

    def job_status(self, job_id: str) -> dict[str, str]:
        return dict(self.conn.r.hgetall(keys.job_status(job_id)))

    # --- counters, the supervisor's jobs, names ---------------------------------
    def count_measurements(self, job_id: str, wk: str, **counts: int) -> None:
        pipe = self.conn.r.pipeline()
        for name, n in counts.items():
            if n:
                pipe.hincrby(keys.job_counts(job_id), f"{wk}|{name}", n)
        pipe.execute()

    def job_counts(self, job_id: str) -> dict[str, dict[str, int]]:
        return counts_of(self.conn.r.hgetall(keys.job_counts(job_id)))

    def active_jobs(self) -> list[str]:
        return sorted(self.conn.r.smembers(keys.active_jobs()))

    def set_active(self, job_id: str, active: bool) -> None:
        if active:
            self.conn.r.sadd(keys.active_jobs(), job_id)
        else:
            self.conn.r.srem(keys.active_jobs(), job_id)

    def claim_name(self, name: str, job_id: str) -> str | None:
        with self.conn.r.pipeline() as pipe:
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
        return self.conn.r.hget(keys.job_names(), name)

    # --- the final choice, a job run again ----------------------------------------
    def finalize_once(self, job_id: str, picks: dict[str, str]) -> tuple[dict[str, str], bool]:
        first = bool(self.conn.r.set(keys.job_final(job_id), json.dumps(picks, sort_keys=True),
                                     nx=True))
        return (dict(picks) if first else self.final_picks(job_id) or dict(picks)), first

    def final_picks(self, job_id: str) -> dict[str, str] | None:
        raw = self.conn.r.get(keys.job_final(job_id))
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
        self.conn.r.delete(keys.job_final(job_id), keys.job_tasks(job_id),
                           keys.job_measured(job_id), keys.job_allocated(job_id),
                           keys.job_status(job_id))
