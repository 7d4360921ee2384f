"""The worker hosts' heartbeats on Redis (the contract: farm/store/hosts.py), each a key
that expires. `RedisHosts`, a part of RedisStore (store.py), on the store's connection
(connection.py)."""

from __future__ import annotations

from farm.core import keys
from farm.core.errors import StoreError
from farm.store.hosts import HostBeat, HostRegistry
from farm.store.redis.connection import RedisConnection


class RedisHosts(HostRegistry):
    """The live worker hosts of RedisStore."""

    def __init__(self, conn: RedisConnection) -> None:
        self.conn = conn

    def publish_host(self, beat: HostBeat, ttl_s: float) -> None:
        self.conn.r.set(keys.host(beat.name), beat.dumps(), ex=max(1, round(ttl_s)))

    def remove_host(self, name: str) -> None:
        self.conn.r.delete(keys.host(name))

    def hosts(self) -> list[HostBeat]:
        out = []
        for key in sorted(self.conn.r.scan_iter(match=keys.host_pattern(), count=100)):
            raw = self.conn.r.get(key)
            if raw is None:  # expired meanwhile
                continue
            try:
                out.append(HostBeat.loads(raw))
            except (StoreError, AttributeError, TypeError):  # a bad heartbeat is shown, not fatal
                out.append(HostBeat(name=str(key), tracker="?", phones={}))
        return out
