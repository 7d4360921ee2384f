"""A round as every part of it sees it: what it knows from its start to its result, and the
lease it holds on its workload (workers/round/measure.py runs it, lend/phone_side.py lends its search)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from farm.core.messages import RoundRequest, RoundResult, TuneTask
from farm.store import RecordStore, TaskState
from workers.round.context import WorkerContext

if TYPE_CHECKING:
    from workers.metaschedule.callback import RoundCounters

LEASE_TTL_S = 300.0  # a workload's lease; renewed by every measured batch of the round (and
# while a lent round waits for its helper's batches: workers/round/lend/phone_side.py)


@dataclass
class Round:
    """What one round knows, from its start to its result: the worker's context, the store,
    the request, its workload's task, the task's state before the round, how many trials
    the workload still lacks and how many this round measures of them."""

    ctx: WorkerContext
    store: RecordStore
    req: RoundRequest
    task: TuneTask
    prior: TaskState
    missing: int
    trials: int
    # told each batch's counters (the app's progress and fence check)
    on_progress: Callable[[RoundCounters], None] | None = None
    t0: float = field(default_factory=time.monotonic)

    def result(self, measured: int, valid: int) -> RoundResult:
        """This round's result: its identity, wall time and counts (the rest: `replace`)."""
        return RoundResult(job_id=self.req.job_id, workload_key=self.req.workload_key,
                           round_index=self.req.round_index, host=self.ctx.host,
                           measured=measured, valid=valid, wall_s=time.monotonic() - self.t0)
