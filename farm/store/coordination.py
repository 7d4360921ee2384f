"""The store's coordination: once-only flags, a job budget's allocation, a workload's
lease, a round's fence, the supervisor's leader lock.

Contract (tests/unit/test_store_*.py, every implementation): every method is atomic
across processes and hosts. A lease or fence expires `ttl_s` after its last renewal, so a
dead holder frees it; only the holder renews or releases it; `finish_round` marks a round
done only for its holder (or when nobody holds it) and releases the fence in the same step.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Protocol


class Coordination(Protocol):
    """Who may do what, once (see the module docstring for the contract)."""

    @abstractmethod
    def claim(self, key: str, ttl_s: float | None = None) -> bool:
        """Set a once-only flag (round done, next round sent, finalize). True for the first caller."""

    @abstractmethod
    def allocate(self, job_id: str, trials: int, budget: int) -> int:
        """Reserve up to `trials` of the job's budget (atomic); returns the trials granted."""

    @abstractmethod
    def acquire_lease(self, wk: str, owner: str, ttl_s: float) -> str | None:
        """Take (or renew) the workload's lease for `owner`. None when taken; else the holder."""

    @abstractmethod
    def release_lease(self, wk: str, owner: str) -> None:
        """Give the lease back if `owner` holds it."""

    # --- rounds: fenced, at most one copy runs, none after it is done -------
    @abstractmethod
    def acquire_round(self, logical_id: str, owner: str, ttl_s: float,
                      dead_holder: str = "") -> str | None:
        """Take (or renew) the round's lease for `owner` (atomic). `dead_holder`: a holder known
        to be dead whose lease may be taken over. None when `owner` holds it now; else the holder."""

    @abstractmethod
    def release_round(self, logical_id: str, owner: str) -> None:
        """Give the round's lease back if `owner` holds it."""

    @abstractmethod
    def round_holder(self, logical_id: str) -> str | None:
        """Who runs the round now (its lease), or None."""

    def round_holders(self, logical_ids: list[str]) -> list[str | None]:
        """`round_holder` of each (one round trip where the store can: the sweep's)."""
        return [self.round_holder(i) for i in logical_ids]

    @abstractmethod
    def finish_round(self, logical_id: str, owner: str) -> bool:
        """The round ran to its end: no later copy of it runs. Only `owner` holding its lease
        (or nobody) may say so, and the lease is released in the same atomic step; False
        when another copy holds it (this copy's result must not move the job on)."""

    @abstractmethod
    def round_is_done(self, logical_id: str) -> bool: ...

    @abstractmethod
    def round_started(self, logical_id: str) -> int:
        """Count a start of the round; returns how many earlier starts never ended (each
        killed its process: a poison round after a few)."""

    @abstractmethod
    def round_ended(self, logical_id: str) -> None:
        """Count an end of the round (it returned or raised: its process survived)."""

    @abstractmethod
    def round_tunings(self, logical_id: str, add: int = 0) -> int:
        """Copies of the round that began tuning before `add` more are counted."""

    @abstractmethod
    def lead(self, owner: str, ttl_s: float) -> bool:
        """Take or renew the supervisor's leader lock; True while `owner` leads."""
