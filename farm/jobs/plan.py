"""Stage 3, the planner: what the store already holds decides what is asked of the phones,
and after every round, what comes next. Pure: it is told the facts (records in the store,
the round's result, the job's budget) and answers; farm/jobs/advance.py reads the facts
from the store and carries the answer out, for the client (a job's first rounds) and for
the workers and the supervisor (its later ones).

A workload whose records already reach the budget is a cache hit (0 trials);
otherwise only the missing trials are planned, in rounds of `round_trials`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from farm.core.aliases import JsonDict
from farm.core.messages import PRIORITIES, JobSpec, RoundRequest, RoundResult, TuneTask


@dataclass(frozen=True)
class TaskPlan:
    task: TuneTask
    in_store: int  # records of this workload before the job (any job, any model)
    needed: int  # trials still to measure
    max_rounds: int  # rounds allowed (room for rounds cut short by lost phones or duplicates)

    @property
    def cached(self) -> bool:
        return self.needed == 0


def plan(tasks: list[TuneTask], in_store: Mapping[str, int], exhausted: set[str],
         trials_per_task: int, round_trials: int) -> list[TaskPlan]:
    """Each task's plan, given its records in the store (`in_store`, by workload key) and the
    workloads whose search space is known to be exhausted."""
    out = []
    for task in tasks:
        have = in_store.get(task.workload_key, 0)
        # An exhausted search space has nothing new to measure, whatever the budget.
        needed = 0 if task.workload_key in exhausted else max(0, trials_per_task - have)
        rounds = math.ceil(needed / round_trials) if needed else 0
        out.append(TaskPlan(task=task, in_store=have, needed=needed,
                            max_rounds=2 * rounds + 2 if rounds else 0))
    return out


def split_budget(plans: list[TaskPlan], trials_budget: int, trials_per_task: int,
                 round_trials: int) -> tuple[list[TaskPlan], int, int]:
    """A job budget (`--trials N`, 0: none) over the plans: (plans, the budget still to
    measure after what the store holds, the trials of each task's first round). With a
    budget, every task gets a small first round and the planner gives the rest to the tasks
    where a round pays most (`plan_next_round`)."""
    if not trials_budget:
        return plans, 0, round_trials
    have = sum(min(p.in_store, trials_per_task) for p in plans)
    budget = max(0, trials_budget - have)
    if budget == 0:  # the store already holds the whole budget
        return [TaskPlan(p.task, p.in_store, 0, 0) for p in plans], 0, round_trials
    plans = [TaskPlan(p.task, p.in_store, min(p.needed, budget), budget + 2)
             if not p.cached else p for p in plans]
    todo = sum(1 for p in plans if not p.cached)
    return plans, budget, max(1, min(round_trials, budget // max(1, todo)))


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


@dataclass(frozen=True)
class AfterRound:
    """What the planner is told after a round, besides the round and its result."""

    count: int  # records of the workload in the store now
    cancelled: bool = False  # the job was cancelled
    budget: int = 0  # the job's trials budget (0: per task)
    early_stop_rounds: int = 0
    spent: int = 0  # trials the job measured so far
    history: tuple[float, ...] = ()  # the task's best after each round, this one included


@dataclass(frozen=True)
class Verdict:
    """How a task goes on after a round: its state and message, more task-state fields,
    and whether its search space is now known to be exhausted (kept in the store)."""

    state: str
    message: str
    extra: JsonDict
    exhausted: bool = False


def verdict(req: RoundRequest, result: RoundResult, facts: AfterRound) -> Verdict | None:
    """The task's next step after a round, or None for its own next round."""
    count = facts.count
    if facts.cancelled:
        return Verdict("failed", "job cancelled", {})
    if count >= req.target_trials:
        return Verdict("done", f"{count} trials in store", {})
    if result.handed_off and not facts.budget:  # the rest of its trials went to an idle host
        return None
    if result.single_schedule and result.device_lost == 0 and count >= 1:
        return Verdict("exhausted", "one possible schedule: measured once",
                       {"single_schedule": True}, exhausted=True)
    if (not result.skipped and result.device_lost == 0
            and result.measured + result.duplicates + result.skipped_stored < result.requested):
        # MetaSchedule stopped before the trials asked for: no new candidate is left.
        if count == 0:  # e.g. adaptive pooling with uneven windows: no sample passes its rules
            return Verdict("exhausted", "MetaSchedule proposed no candidate for it (TVM's "
                                        "default schedule is used)", {}, exhausted=True)
        return Verdict("exhausted", f"search space exhausted after {count} distinct "
                                    "candidates", {}, exhausted=True)
    if stopped_early(list(facts.history), facts.early_stop_rounds):
        return Verdict("done", f"stopped early: no gain in the last {facts.early_stop_rounds} "
                               "rounds", {})
    if req.round_index + 1 >= req.max_rounds:
        return Verdict("exhausted", f"{req.max_rounds} rounds used, {count} trials in store", {})
    if facts.budget and facts.spent >= facts.budget:
        return Verdict("done", f"job budget of {facts.budget} trials spent", {})
    if facts.budget:
        return Verdict("ready", "ready for another round", {})
    return None


IN_FLIGHT = 2  # rounds of one budgeted job in flight at once (keeps the phones busy)


def round_of(job: JobSpec, wk: str, index: int, trials: int,
             max_rounds: int | None = None) -> RoundRequest:
    """Round `index` of workload `wk` of `job`, as it is sent: a task's first (its plan's
    `max_rounds`) and, in a budgeted job, every later one (the job's)."""
    return RoundRequest(
        job_id=job.job_id, workload_key=wk, task_name=job.task_names.get(wk, wk),
        round_index=index, trials=trials, target_trials=job.trials_per_task,
        max_rounds=job.max_rounds if max_rounds is None else max_rounds,
        device_key=job.device_key, model=job.model, run=job.run,
        priority=PRIORITIES.get(job.priority, PRIORITIES["normal"]))
