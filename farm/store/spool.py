"""The spool: whole records on their way from Redis to the archive (farm/store/cold.py).

Contract of every store (tests/unit/test_store_archive.py, run against each):

- The commit pushes a whole record that leaves a workload's hot K onto the spool's tail,
  atomically with it; only a drain takes items, from the head.
- A drainer holds the drain lease (`DRAIN_LEASE`, renewed per batch). `spooled` reads a batch
  and removes nothing; `unspool` removes exactly that batch, and only while its drainer holds
  the lease and the spool still begins with it, in one atomic step. A drainer that stalled
  past its lease removes nothing: another drainer archives those records (twice is harmless:
  readers keep one copy per candidate), and records spooled since are never touched.
- An item that cannot be read is moved to the dead-letter list by the `unspool` of its
  batch: kept for a person to look at (`dead_letters` counts them), never dropped.
"""

from __future__ import annotations

import hashlib
from abc import abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

DRAIN_LEASE = "spool"  # the drain's lease, a name for Coordination.acquire_lease


@dataclass(frozen=True)
class SpoolBatch:
    """What a drainer read from the spool's head."""

    taken: int  # items read
    digest: str  # what they were (`digest`): unspool removes them only if still the head
    records: list[tuple[str, str]]  # (workload key, record JSON) of the readable ones
    unreadable: tuple[int, ...] = ()  # positions of the items that could not be read


def digest(items: Iterable[bytes]) -> str:
    """The identity of a run of spool items (unspool.lua computes the same in Redis)."""
    parts = "".join(hashlib.sha1(item).hexdigest() for item in items)
    return hashlib.sha1(parts.encode()).hexdigest()


class Spool(Protocol):
    """Records leaving Redis for the archive (see the module docstring for the contract)."""

    @abstractmethod
    def spooled(self, n: int) -> SpoolBatch:
        """Read the first `n` items of the spool; they stay until `unspool`."""

    @abstractmethod
    def unspool(self, batch: SpoolBatch, owner: str) -> bool:
        """Remove `batch` (written to the archive) and move its unreadable items to the
        dead-letter list, if `owner` holds the drain lease and the spool still begins with
        the batch (atomic). False, removing nothing, otherwise."""

    @abstractmethod
    def spool_size(self) -> int: ...

    @abstractmethod
    def dead_letters(self) -> int:
        """Spool items kept aside because they could not be read."""
