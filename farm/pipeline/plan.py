"""Stage 3, plan: what the store already has decides what is asked of the phones.

A workload whose records already reach the budget is a cache hit (0 trials);
otherwise only the missing trials are planned, in rounds of `round_trials`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from farm.core.messages import TuneTask
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


def stopped_early(history: list[float], rounds: int, min_gain: float = 0.01) -> bool:
    """No round of the last `rounds` improved the best by `min_gain` (relative)."""
    if rounds <= 0 or len(history) <= rounds:
        return False
    before = history[-rounds - 1]
    return history[-1] > before * (1 - min_gain)


def score(weight: int, history: list[float]) -> float:
    """What one more round of a task is worth: weight x current best x recent improvement
    (in the spirit of MetaSchedule's gradient task scheduler). No valid record: last."""
    if not history:
        return 0.0
    best = history[-1]
    gain = (history[-2] - best) / history[-2] if len(history) >= 2 and history[-2] > 0 else 1.0
    return weight * best * (0.1 + max(0.0, gain))


def next_task(ready: dict[str, tuple[int, list[float]]]) -> str | None:
    """The ready task (workload key -> (weight, history)) that gets the next round."""
    if not ready:
        return None
    return max(sorted(ready), key=lambda wk: score(*ready[wk]))
