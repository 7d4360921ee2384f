"""Stage 3, plan: what the store already has decides what is asked of the phones.

A workload whose records already reach the budget is a cache hit (0 trials);
otherwise only the missing trials are planned, in rounds of `round_trials`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from farm.messages import TuneTask
from farm.store import RecordStore


@dataclass(frozen=True)
class TaskPlan:
    task: TuneTask
    in_store: int  # records of this workload before the job (any job, any model)
    needed: int  # trials still to measure
    max_rounds: int  # rounds allowed (room for rounds cut short by lost phones or duplicates)

    @property
    def cached(self) -> bool:
        return self.needed == 0


def plan(tasks: list[TuneTask], store: RecordStore, trials_per_task: int,
         round_trials: int) -> list[TaskPlan]:
    out = []
    for task in tasks:
        have = store.record_count(task.workload_key)
        # An exhausted search space has nothing new to measure, whatever the budget.
        needed = 0 if store.exhausted(task.workload_key) else max(0, trials_per_task - have)
        rounds = math.ceil(needed / round_trials) if needed else 0
        out.append(TaskPlan(task=task, in_store=have, needed=needed,
                            max_rounds=2 * rounds + 2 if rounds else 0))
    return out
