"""The spool on Redis (the contract: farm/store/spool.py): a list the commit pushes onto
(keep_best.lua), trimmed only by unspool.lua, which checks the drain lease and the batch.
`RedisSpool`, a part of RedisStore (store.py), on the store's connection (connection.py)."""

from __future__ import annotations

import logging

import redis

from farm.core import keys
from farm.store.redis.connection import RedisConnection
from farm.store.redis.records import RedisRecords
from farm.store.spool import DRAIN_LEASE, Spool, SpoolBatch, digest

log = logging.getLogger(__name__)


class RedisSpool(Spool):
    """The spool of RedisStore; its items are read as `records` reads a whole record (with
    its workload's dictionary)."""

    def __init__(self, conn: RedisConnection, records: RedisRecords) -> None:
        self.conn = conn
        self.records = records

    def spooled(self, n: int) -> SpoolBatch:
        items = self.conn.rb.lrange(keys.spool(), 0, max(0, n - 1))
        out, unreadable = [], []
        for at, item in enumerate(items):
            wk, _, blob = item.partition(b"\n")
            try:  # as JSON text: the archive writes it as it is (no parse, no dump)
                out.append((wk.decode(), self.records.record_text(wk.decode(), blob)))
            except redis.RedisError:
                raise  # Redis away a moment (reading the dictionary): the drain tries later
            except Exception as e:  # noqa: BLE001 - bad data must never crash a worker
                log.warning("store: a record of %s in the spool cannot be read (kept at %s): "
                            "%s", wk, keys.spool_dead(), e)
                unreadable.append(at)
        return SpoolBatch(len(items), digest(items), out, tuple(unreadable))

    def unspool(self, batch: SpoolBatch, owner: str) -> bool:
        if batch.taken <= 0:
            return True
        done = self.conn.scripts.unspool(
            keys=[keys.spool(), keys.lease(DRAIN_LEASE), keys.spool_dead()],
            args=[owner, batch.taken, batch.digest, *batch.unreadable])
        return int(done) == 1

    def spool_size(self) -> int:
        return int(self.conn.r.llen(keys.spool()))

    def dead_letters(self) -> int:
        return int(self.conn.r.llen(keys.spool_dead()))
