"""The spool on Redis (the contract: farm/store/spool.py): a list the commit pushes onto
(keep_best.lua), trimmed only by unspool.lua, which checks the drain lease and the batch."""

from __future__ import annotations

import logging
from abc import abstractmethod

import redis

from farm.core import keys
from farm.core.aliases import RedisClient, RedisScript
from farm.store.spool import DRAIN_LEASE, Spool, SpoolBatch, digest

log = logging.getLogger(__name__)


class RedisSpool(Spool):
    """The spool half of RedisStore (which gives `r`, `rb`, `_unspool` and `_record_text`)."""

    _unspool: RedisScript

    @property
    def r(self) -> RedisClient: ...  # noqa: D102 - given by RedisStore

    @property
    def rb(self) -> RedisClient: ...  # noqa: D102 - given by RedisStore

    @abstractmethod
    def _record_text(self, wk: str, blob: bytes) -> str:
        """A spooled record's JSON (RedisRecords: with its workload's dictionary)."""

    def spooled(self, n: int) -> SpoolBatch:
        items = self.rb.lrange(keys.spool(), 0, max(0, n - 1))
        out, unreadable = [], []
        for at, item in enumerate(items):
            wk, _, blob = item.partition(b"\n")
            try:  # as JSON text: the archive writes it as it is (no parse, no dump)
                out.append((wk.decode(), self._record_text(wk.decode(), blob)))
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
        self.r  # noqa: B018 - make sure the scripts are registered
        done = self._unspool(keys=[keys.spool(), keys.lease(DRAIN_LEASE), keys.spool_dead()],
                             args=[owner, batch.taken, batch.digest, *batch.unreadable])
        return int(done) == 1

    def spool_size(self) -> int:
        return int(self.r.llen(keys.spool()))

    def dead_letters(self) -> int:
        return int(self.r.llen(keys.spool_dead()))
