"""The Redis server itself (the contract: `StoreHealth` in farm/store/store.py): reachable
and writable, its memory and how close it is to refusing writes. `RedisHealth`, a part of
RedisStore (store.py), on the store's connection (connection.py)."""

from __future__ import annotations

import time

import redis

from farm.core import keys
from farm.core.errors import ServiceError
from farm.store.redis.connection import RedisConnection
from farm.store.store import StoreHealth


class RedisHealth(StoreHealth):
    """The health of RedisStore's server."""

    def __init__(self, conn: RedisConnection) -> None:
        self.conn = conn

    def ping(self) -> None:
        try:
            self.conn.r.ping()
            self.conn.r.set(keys.key_for("ping"), str(time.time()))
        except redis.RedisError as e:
            raise ServiceError(f"Redis is not reachable or not writable: {e}",
                               subject=self.conn.where,
                               hint="check it with `redis-cli -u URL ping`, or unset "
                                    "FARM_BROKER_URL to use the embedded farm") from e

    def memory(self) -> tuple[int, int] | None:
        info = self.conn.r.info("memory")
        return int(info.get("used_memory") or 0), int(info.get("maxmemory") or 0)

    def memory_at_start(self) -> int:
        return int(self.conn.r.info("memory").get("used_memory_startup") or 0)

    def full(self) -> str | None:
        info = self.conn.r.info("memory")
        limit, used = int(info.get("maxmemory") or 0), int(info.get("used_memory") or 0)
        # Redis counts a command's own arguments too: a store this close to its limit
        # refuses the writes of rounds (records of a few KB) and of the job's end
        if limit and used >= 0.98 * limit and info.get("maxmemory_policy") == "noeviction":
            return (f"Redis {self.conn.where} holds {used} bytes, its maxmemory is {limit}: "
                    "it refuses writes (it evicts nothing)")
        return None
