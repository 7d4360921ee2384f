"""A round's CPU account: the host CPU seconds a round took, per part.

A round's CPU is its own process's (every thread: the search, the cost model, the store's
client) and its calls in the helper processes it shares with the next rounds of its process
(workers/metaschedule/procs.py: the builds, linker included, and the measuring client's session,
upload and timing calls). The loop (workers/round/loop.py) splits what it spends into
its parts; `setup` is the cost model and the search set up before it; `other` is the rest of
the round (loading the workload, the reference kernel, a lent round's batches received and
committed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from workers.round.loop import PARTS, helper_cpu_s

CPU_PARTS = ("setup", *PARTS, "other")


@dataclass
class RoundClock:
    """The CPU seconds a round has taken since it was made: this process's and those of its
    builder's and runner's calls."""

    builder: object
    runner: object
    _t0: tuple[float, float, float] = field(init=False)

    def __post_init__(self) -> None:
        self._t0 = self._now()

    def _now(self) -> tuple[float, float, float]:
        return time.process_time(), helper_cpu_s(self.builder), helper_cpu_s(self.runner)

    def total_s(self) -> float:
        return sum(b - a for a, b in zip(self._t0, self._now(), strict=True))

    def runner_s(self) -> float:
        """The measuring client's CPU seconds since the round began."""
        return helper_cpu_s(self.runner) - self._t0[2]


def account(parts: dict[str, float], total_s: float) -> dict[str, float]:
    """CPU seconds per part (CPU_PARTS), `other` what the parts leave of `total_s`."""
    out = {p: round(max(0.0, parts.get(p, 0.0)), 3) for p in CPU_PARTS[:-1]}
    out["other"] = round(max(0.0, total_s - sum(parts.values())), 3)
    return out
