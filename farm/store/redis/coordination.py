"""Coordination on Redis (the contract: farm/store/coordination.py): once-only flags, a job
budget's allocation, leases and a round's fence (lease.lua, release_lease.lua,
finish_round.lua), the supervisor's lock. `RedisCoordination`, a part of RedisStore
(store.py), on the store's connection (connection.py)."""

from __future__ import annotations

import time

from farm.core import keys
from farm.store.coordination import Coordination
from farm.store.redis.connection import RedisConnection


class RedisCoordination(Coordination):
    """The coordination of RedisStore: each step one atomic command or script."""

    def __init__(self, conn: RedisConnection) -> None:
        self.conn = conn

    def claim(self, key: str, ttl_s: float | None = None) -> bool:
        px = None if ttl_s is None else int(ttl_s * 1000)
        return bool(self.conn.r.set(key, str(time.time()), nx=True, px=px))

    def allocate(self, job_id: str, trials: int, budget: int) -> int:
        key = keys.job_allocated(job_id)
        total = int(self.conn.r.incrby(key, trials))
        over = max(0, total - budget)
        if over:
            self.conn.r.decrby(key, min(over, trials))
        return max(0, trials - over)

    def _take(self, key: str, owner: str, ttl_s: float, dead_holder: str = "") -> str | None:
        holder = self.conn.scripts.lease(keys=[key], args=[owner, max(1, int(ttl_s * 1000)),
                                                           dead_holder])
        return holder or None

    def acquire_lease(self, wk: str, owner: str, ttl_s: float) -> str | None:
        return self._take(keys.lease(wk), owner, ttl_s)

    def release_lease(self, wk: str, owner: str) -> None:
        self.conn.scripts.release(keys=[keys.lease(wk)], args=[owner])

    def lead(self, owner: str, ttl_s: float) -> bool:
        return self._take(keys.supervisor(), owner, ttl_s) is None

    # --- rounds ---------------------------------------------------------------
    def acquire_round(self, logical_id: str, owner: str, ttl_s: float,
                      dead_holder: str = "") -> str | None:
        return self._take(keys.round_lease(logical_id), owner, ttl_s, dead_holder)

    def release_round(self, logical_id: str, owner: str) -> None:
        self.conn.scripts.release(keys=[keys.round_lease(logical_id)], args=[owner])

    def round_holder(self, logical_id: str) -> str | None:
        return self.conn.r.get(keys.round_lease(logical_id))

    def round_holders(self, logical_ids: list[str]) -> list[str | None]:
        if not logical_ids:
            return []
        return list(self.conn.r.mget([keys.round_lease(i) for i in logical_ids]))

    def finish_round(self, logical_id: str, owner: str) -> bool:
        return bool(self.conn.scripts.finish(
            keys=[keys.round_lease(logical_id), keys.round_done(logical_id)],
            args=[owner, str(time.time()), keys.JOB_TTL_S]))

    def round_is_done(self, logical_id: str) -> bool:
        return bool(self.conn.r.exists(keys.round_done(logical_id)))

    def round_started(self, logical_id: str) -> int:
        key = keys.round_starts(logical_id)
        pipe = self.conn.r.pipeline()
        pipe.hincrby(key, "starts", 1)
        pipe.hget(key, "ends")
        pipe.expire(key, keys.JOB_TTL_S)
        starts, ends, _ = pipe.execute()
        return int(starts) - 1 - int(ends or 0)

    def round_ended(self, logical_id: str) -> None:
        self.conn.r.hincrby(keys.round_starts(logical_id), "ends", 1)

    def round_tunings(self, logical_id: str, add: int = 0) -> int:
        key = keys.round_starts(logical_id)
        pipe = self.conn.r.pipeline()
        pipe.hincrby(key, "tunings", add)
        pipe.expire(key, keys.JOB_TTL_S)
        return int(pipe.execute()[0]) - add
