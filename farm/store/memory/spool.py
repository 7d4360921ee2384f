"""The spool in memory (MemoryStore's; the contract: farm/store/spool.py)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from farm.store.spool import DRAIN_LEASE, Spool, SpoolBatch, digest

if TYPE_CHECKING:
    from farm.store.store import StoredRecord


class MemorySpool(Spool):
    """Records in a list; the drain lease is the store's (`_holder`, as acquire_lease)."""

    _lock: threading.Lock
    _spool: list[StoredRecord]
    _dead: list[StoredRecord]

    def _holder(self, key: str) -> str | None: ...  # given by MemoryStore

    def spooled(self, n: int) -> SpoolBatch:
        with self._lock:
            taken = self._spool[:n]
        lines = [r.dumps() for r in taken]
        return SpoolBatch(len(taken), digest(line.encode() for line in lines),
                          [(r.workload_key, line) for r, line in zip(taken, lines, strict=True)])

    def unspool(self, batch: SpoolBatch, owner: str) -> bool:
        with self._lock:
            if self._holder(f"wl:{DRAIN_LEASE}") != owner:
                return False
            head = self._spool[:batch.taken]
            if len(head) != batch.taken or digest(r.dumps().encode() for r in head) != (
                    batch.digest):
                return False
            self._dead.extend(head[at] for at in batch.unreadable)
            del self._spool[:batch.taken]
            return True

    def spool_size(self) -> int:
        return len(self._spool)

    def dead_letters(self) -> int:
        return len(self._dead)
