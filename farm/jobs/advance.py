"""After a round: the task's next step, carried out. The planner (farm/jobs/plan.py)
decides from the facts this module reads in the store; this module writes the task's new
state and sends its next round (farm/jobs/dispatch.py). Per-task budgets: the workload's own
next round is sent (once: a claimed key). A job budget (`--trials N`): the finished task
becomes `ready`, and the planner gives the job's next round to the ready task where a round
pays most (`plan_next_round`). The worker after a round and the supervisor both call it.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from farm.core import keys
from farm.core.aliases import CeleryApp, JsonDict
from farm.core.errors import best_effort
from farm.core.messages import JobSpec, RoundRequest, RoundResult
from farm.jobs import finalize as finalize_stage
from farm.jobs.dispatch import send_round
from farm.jobs.plan import IN_FLIGHT, AfterRound, next_task, round_of, verdict
from farm.store import TaskState
from farm.store.jobs import JobWriter, added
from farm.store.store import JobRecords, RecordReader, RecordsAndJobs, updated

log = logging.getLogger(__name__)


def continue_job(app: CeleryApp, store: RecordsAndJobs, req: RoundRequest,
                 result: RoundResult) -> None:
    """After a round: the workload is done, exhausted, stopped, or gets its next round (the
    planner's verdict). The task's state names its next round before the round is sent, so
    a send that fails is sent again by the supervisor."""
    job = store.get_job(req.job_id)
    prior = store.task_states(req.job_id).get(req.workload_key, TaskState())
    base = _after_round(store, req, result, prior)
    step = verdict(req, result, _facts(store, req, job, base["history"]))
    if step is None:  # the workload's own next round
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
    if step.exhausted:
        best_effort(store.mark_exhausted, req.workload_key, store.record_count(req.workload_key))
    state = updated(prior, state=step.state, message=step.message, **step.extra, **base)
    best_effort(store.set_task_state, req.job_id, req.workload_key, state)
    log.info("job %s: %s is %s (%s)", req.job_id, req.task_name, state.state, state.message)
    if job is not None and job.trials_budget:
        plan_next_round(app, store, job)
    if job is not None and finalize_stage.job_finished(store, job):
        # the last task ended: finalize here, so the job is finished even if no client waits
        best_effort(finalize_stage.finalize_job, store, job, f"worker {result.host}")


def _after_round(store: RecordReader, req: RoundRequest, result: RoundResult,
                 prior: TaskState) -> JsonDict:
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
                measure_s=prior.measure_s + result.measure_s,
                cpu=added(prior.cpu, result.cpu),
                helper_cpu=added(prior.helper_cpu, result.helper_cpu),
                searched_by=sorted({*prior.searched_by, result.searched_by} - {""}))


def _facts(store: JobRecords, req: RoundRequest, job: JobSpec | None,
           history: list[float]) -> AfterRound:
    """What the planner is told after a round, read from the store."""
    budget = job.trials_budget if job else 0
    return AfterRound(
        count=store.record_count(req.workload_key),
        cancelled=store.job_status(req.job_id).get("state") == "cancelled",
        budget=budget, early_stop_rounds=job.early_stop_rounds if job else 0,
        spent=sum(store.job_measured(req.job_id).values()) if budget else 0,
        history=tuple(history))


def plan_next_round(app: CeleryApp, store: RecordsAndJobs, job: JobSpec) -> None:
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


def _close(store: JobWriter, job: JobSpec, tasks: dict[str, TaskState], why: str) -> None:
    for wk, s in tasks.items():
        best_effort(store.set_task_state, job.job_id, wk, updated(s, state="done", message=why))
