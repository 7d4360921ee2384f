"""The spool in memory (the contract: farm/store/spool.py): `MemorySpool`, a part of
MemoryStore (store.py), under the store's lock."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from farm.store.spool import Spool, SpoolBatch, digest

if TYPE_CHECKING:
    from farm.store.store import StoredRecord


class MemorySpool(Spool):
    """Records in a list. `lock` is the store's (a commit spools under it, atomically with its
    insert); `drainer` says who holds the drain lease (the store's leases), `lock` held."""

    def __init__(self, lock: threading.Lock, drainer: Callable[[], str | None]) -> None:
        self._lock = lock
        self._drainer = drainer
        self._items: list[StoredRecord] = []
        self._dead: list[StoredRecord] = []  # never: a record in memory is always readable

    def push(self, rec: StoredRecord) -> None:
        """A whole record leaving its workload's hot K (the commit's; `lock` held)."""
        self._items.append(rec)

    def spooled(self, n: int) -> SpoolBatch:
        with self._lock:
            taken = self._items[:n]
        lines = [r.dumps() for r in taken]
        return SpoolBatch(len(taken), digest(line.encode() for line in lines),
                          [(r.workload_key, line) for r, line in zip(taken, lines, strict=True)])

    def unspool(self, batch: SpoolBatch, owner: str) -> bool:
        with self._lock:
            if self._drainer() != owner:
                return False
            head = self._items[:batch.taken]
            if len(head) != batch.taken or digest(r.dumps().encode() for r in head) != (
                    batch.digest):
                return False
            self._dead.extend(head[at] for at in batch.unreadable)
            del self._items[:batch.taken]
            return True

    def spool_size(self) -> int:
        return len(self._items)

    def dead_letters(self) -> int:
        return len(self._dead)
