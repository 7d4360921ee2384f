"""Stage 3, plan: what the store already has decides what is asked of the phones, and after
every round, what comes next. The one planner: the client plans a job's first rounds
(`plan`, `split_budget`), the workers and the supervisor its later ones (`continue_job`,
`plan_next_round`).

A workload whose records already reach the budget is a cache hit (0 trials);
otherwise only the missing trials are planned, in rounds of `round_trials`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Any

from farm.core import keys
from farm.core.errors import best_effort
from farm.core.messages import PRIORITIES, JobSpec, RoundRequest, RoundResult, TuneTask
from farm.jobs import finalize as finalize_stage
from farm.jobs.dispatch import send_round
from farm.store import RecordStore, TaskState
from farm.store.store import updated

log = logging.getLogger(__name__)


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


def continue_job(app: Any, store: RecordStore, req: RoundRequest, result: RoundResult) -> None:
    """After a round: the workload is done, exhausted, stopped, or gets its next round.

    Per-task budgets: the workload's own next round is sent (once: a claimed key).
    A job budget (`--trials N`): the finished task becomes `ready`, and the planner
    gives the job's next round to the ready task where a round pays most.
    The task's state names its next round before the round is sent, so a send that fails
    is sent again by the supervisor.
    """
    job = store.get_job(req.job_id)
    prior = store.task_states(req.job_id).get(req.workload_key, TaskState())
    base = _after_round(store, req, result, prior)
    verdict = _verdict(store, req, result, job, base["history"])
    if verdict is None:  # the workload's own next round
        nxt = RoundRequest.from_json({**req.to_json(), "round_index": req.round_index + 1,
                                      "attempt": 0,  # a hand-off does not use up a round
                                      "max_rounds": req.max_rounds + int(result.handed_off)})
        # the state names the next round first: if this process dies before the send, the
        # supervisor finds a queued round with no live copy and sends it
        store.set_task_state(req.job_id, req.workload_key, updated(
            prior, state="queued", message=f"round {nxt.round_index + 1} queued",
            round=nxt.to_json(), **base))
        if store.claim(keys.round_sent(nxt.logical_id), ttl_s=keys.JOB_TTL_S):
            send_round(app, nxt, countdown_s=1.0 if result.device_lost else None)
        return
    name, message, extra = verdict
    state = updated(prior, state=name, message=message, **extra, **base)
    best_effort(store.set_task_state, req.job_id, req.workload_key, state)
    log.info("job %s: %s is %s (%s)", req.job_id, req.task_name, state.state, state.message)
    if job is not None and job.trials_budget:
        plan_next_round(app, store, job)
    if job is not None and finalize_stage.job_finished(store, job):
        # the last task ended: finalize here, so the job is finished even if no client waits
        best_effort(finalize_stage.finalize_job, store, job, f"worker {result.host}")


def _after_round(store: RecordStore, req: RoundRequest, result: RoundResult,
                 prior: TaskState) -> dict[str, Any]:
    """The task's numbers with this round's added: failures, lost phones, best, history."""
    failures = dict(prior.failures)
    for k, v in result.failures.items():
        failures[k] = failures.get(k, 0) + v
    best = store.best(req.workload_key)
    gained = [best.run_us] if best and best.run_us and not result.skipped else []
    errors = {**result.errors, **prior.errors}  # the first message of each class stays
    return dict(failures=failures, errors=errors, valid=prior.valid + result.valid,
                device_lost=prior.device_lost + result.device_lost,
                best_us=best.run_us if best else None, host=result.host,
                rounds=max(prior.rounds, req.round_index + 1),
                history=list(prior.history) + gained,
                measure_s=prior.measure_s + result.measure_s)


def _verdict(store: RecordStore, req: RoundRequest, result: RoundResult, job: JobSpec | None,
             history: list[float]) -> tuple[str, str, dict[str, Any]] | None:
    """How the task goes on after a round: (state, message, more fields), or None for its
    own next round. Marks an exhausted search space in the store."""
    count = store.record_count(req.workload_key)
    budget = job.trials_budget if job else 0
    early = job.early_stop_rounds if job else 0
    if store.job_status(req.job_id).get("state") == "cancelled":
        return "failed", "job cancelled", {}
    if count >= req.target_trials:
        return "done", f"{count} trials in store", {}
    if result.handed_off and not budget:  # the rest of its trials went to an idle host
        return None
    if result.single_schedule and result.device_lost == 0 and count >= 1:
        best_effort(store.mark_exhausted, req.workload_key, count)
        return "exhausted", "one possible schedule: measured once", {"single_schedule": True}
    if (not result.skipped and result.device_lost == 0
            and result.measured + result.duplicates + result.skipped_stored < result.requested):
        # MetaSchedule stopped before the trials asked for: no new candidate is left.
        best_effort(store.mark_exhausted, req.workload_key, count)
        if count == 0:  # e.g. adaptive pooling with uneven windows: no sample passes its rules
            return "exhausted", ("MetaSchedule proposed no candidate for it (TVM's default "
                                 "schedule is used)"), {}
        return "exhausted", f"search space exhausted after {count} distinct candidates", {}
    if stopped_early(history, early):
        return "done", f"stopped early: no gain in the last {early} rounds", {}
    if req.round_index + 1 >= req.max_rounds:
        return "exhausted", f"{req.max_rounds} rounds used, {count} trials in store", {}
    if budget and sum(store.job_measured(req.job_id).values()) >= budget:
        return "done", f"job budget of {budget} trials spent", {}
    if budget:
        return "ready", "ready for another round", {}
    return None


IN_FLIGHT = 2  # rounds of one budgeted job in flight at once (keeps the phones busy)


def round_of(job: JobSpec, wk: str, index: int, trials: int) -> RoundRequest:
    """Round `index` of workload `wk` of a budgeted job, as the planner sends it."""
    return RoundRequest(
        job_id=job.job_id, workload_key=wk, task_name=job.task_names.get(wk, wk),
        round_index=index, trials=trials, target_trials=job.trials_per_task,
        max_rounds=job.max_rounds, device_key=job.device_key, model=job.model, run=job.run,
        priority=PRIORITIES.get(job.priority, PRIORITIES["normal"]))


def plan_next_round(app: Any, store: RecordStore, job: JobSpec) -> None:
    """Job budget: once every task has had its first round, keep IN_FLIGHT rounds going, each
    given to the ready task where a round pays most; close the job's tasks when it is spent.
    Idempotent (each round is claimed once): the worker after a round and the supervisor
    both call it."""
    budget = job.trials_budget
    spent = sum(store.job_measured(job.job_id).values())
    states = store.task_states(job.job_id)
    ready = {wk: s for wk, s in states.items() if s.state == "ready"}
    busy = [wk for wk, s in states.items() if s.outstanding]
    if spent >= budget:
        _close(store, job, ready, f"job budget of {budget} trials spent")
        return
    if any(states[wk].rounds == 0 or not states[wk].history for wk in busy):
        return  # first rounds still running: scores are not comparable yet
    while ready and len(busy) < IN_FLIGHT:
        pick = next_task({wk: (job.weights.get(wk, 1), s.history)
                                     for wk, s in ready.items()})
        if pick is None:
            return
        state = ready.pop(pick)
        nxt = round_of(job, pick, state.rounds, 0)
        if not store.claim(keys.round_sent(nxt.logical_id), ttl_s=keys.JOB_TTL_S):
            continue
        granted = store.allocate(job.job_id, job.round_trials, budget)
        if granted == 0:  # the whole budget is given to rounds: nothing more to plan
            _close(store, job, {pick: state, **ready}, f"job budget of {budget} trials used")
            return
        nxt = replace(nxt, trials=granted)
        store.set_task_state(job.job_id, pick, updated(
            state, state="queued", message=f"round {nxt.round_index + 1} queued",
            round=nxt.to_json()))
        send_round(app, nxt)
        busy.append(pick)


def _close(store: RecordStore, job: JobSpec, tasks: dict[str, TaskState], why: str) -> None:
    for wk, s in tasks.items():
        best_effort(store.set_task_state, job.job_id, wk, updated(s, state="done", message=why))
