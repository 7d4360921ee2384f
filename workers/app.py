"""The Celery side of a worker host: the round task and its continuation.

Process state: each pool process keeps one `WorkerContext` (warm builder,
runner, TVM) in `_PROCESS`, set up by `worker_process_init`; nothing else is global.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import redis
from celery import signals

from farm.core import keys
from farm.core.config import FarmConfig
from farm.core.errors import FarmError
from farm.core.messages import PRIORITIES, JobSpec, RoundRequest, RoundResult
from farm.pipeline import finalize as finalize_stage
from farm.pipeline import plan as plan_stage
from farm.pipeline.dispatch import ROUND_TASK, make_app, send_round
from farm.store import RecordStore, TaskState, open_store
from workers.fence import RoundFence, RoundStopped
from workers.measure import (
    LEASE_TTL_S,
    LeaseBusy,
    StaleRound,
    WorkerContext,
    best_effort,
    run_round,
    updated,
)

log = logging.getLogger(__name__)

_PROCESS: dict[str, Any] = {}


def build_app(config: FarmConfig, tracker: str, node: str) -> Any:
    app = make_app(config)
    _PROCESS["config"] = config
    _PROCESS["tracker"] = tracker
    _PROCESS["node"] = node
    _PROCESS["app"] = app
    # max_retries=None: a round waiting for another job's lease retries until the lease is free
    app.task(name=ROUND_TASK, bind=True, acks_late=True, reject_on_worker_lost=True,
             max_retries=None)(tune_round)
    return app


@signals.worker_process_init.connect
def _warm_process(**_: Any) -> None:
    if "config" not in _PROCESS:
        return
    ctx = WorkerContext(config=_PROCESS["config"], tracker=_PROCESS["tracker"],
                        host=_PROCESS["node"])
    _PROCESS["ctx"] = ctx
    _PROCESS["store"] = open_store(_PROCESS["config"].store_url)
    try:
        ctx.warm()
    except Exception as e:  # noqa: BLE001 - warming is an optimisation; the round will say why
        log.warning("worker %s: warm-up failed: %s", ctx.host, e)


def _context() -> tuple[WorkerContext, RecordStore]:
    if "ctx" not in _PROCESS:  # solo pool or a missed signal
        _PROCESS["ctx"] = WorkerContext(config=_PROCESS["config"], tracker=_PROCESS["tracker"],
                                        host=_PROCESS["node"])
        _PROCESS["store"] = open_store(_PROCESS["config"].store_url)
    return _PROCESS["ctx"], _PROCESS["store"]


def tune_round(self: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """One round of one workload, fenced (workers/fence.py): a copy of a round that is done,
    running elsewhere, or no longer the task's current round does not run."""
    req = RoundRequest.from_json(payload)
    ctx, store = _context()
    prior = store.task_states(req.job_id).get(req.workload_key, TaskState())
    current = RoundRequest.from_json(prior.round).logical_id if prior.round else req.logical_id
    if current != req.logical_id or prior.terminal:
        log.info("round %s of %s: skipped, the task is %s (current round %s)", req.round_id,
                 req.task_name, prior.state, current)
        return {"skipped": "superseded"}
    fence = RoundFence(store, req, ctx.host, ttl_s=keys.HOST_TTL_S)
    verdict = fence.enter()
    if verdict == "done":
        if prior.outstanding:  # it ran, but the job did not go on (its worker died)
            continue_job(_PROCESS["app"], store, req, RoundResult(
                job_id=req.job_id, workload_key=req.workload_key, round_index=req.round_index,
                host=ctx.host, measured=0, valid=0, skipped=True))
        return {"skipped": "done"}
    if verdict != "run":
        log.info("round %s of %s: skipped, a live copy runs on %s", req.round_id, req.task_name,
                 verdict)
        return {"skipped": f"running: {verdict}"}
    done = False
    try:
        if fence.poisoned:
            done = True
            _fail(store, req, ctx.host, f"round {req.round_index + 1} killed its worker process "
                                        f"{fence.crashes} times (a poison round): given up")
            return {"failed": "poison round"}
        result = _run(self, ctx, store, req, fence)
        if result is None:
            return {"skipped": "stale"}
        done = True
    finally:
        fence.exit(done)
    continue_job(_PROCESS["app"], store, req, result)
    return result.to_json()


def _run(task: Any, ctx: WorkerContext, store: RecordStore, req: RoundRequest,
         fence: RoundFence) -> RoundResult | None:
    def progress(c: Any) -> None:
        fence.check()
        meta = {"job": req.job_id, "task": req.task_name, "round": req.round_index + 1,
                "trials_done": c.new + c.duplicates, "trials_total": req.trials,
                "best_us": c.best_us, "host": ctx.host, "device_key": req.device_key}
        best_effort(store.acquire_lease, req.workload_key, req.job_id, LEASE_TTL_S)  # renew
        best_effort(task.update_state, None, "PROGRESS", meta)
        best_effort(task.send_event, "task-progress", **meta)
        prior = store.task_states(req.job_id).get(req.workload_key, TaskState())
        best = f", best {c.best_us:.1f} us" if c.best_us else ""
        best_effort(store.set_task_state, req.job_id, req.workload_key, updated(
            prior, state="tuning", host=ctx.host,
            message=f"round {req.round_index + 1}: {c.new + c.duplicates}/{req.trials} trials "
                    f"on {ctx.host}{best}"))

    try:
        return run_round(ctx, store, req, on_progress=progress)
    except StaleRound as e:
        log.info("skipped: %s", e)
        return None
    except redis.RedisError as e:
        # The store went away mid-round (Redis restarting): records committed so far are kept;
        # run the round again later, it measures only what is still missing.
        log.warning("round %s of %s on %s: store unreachable (%s); retrying in 10 s",
                    req.round_index + 1, req.task_name, ctx.host, e)
        raise task.retry(countdown=10, max_retries=60) from e
    except LeaseBusy as e:
        prior = store.task_states(req.job_id).get(req.workload_key, TaskState())
        best_effort(store.set_task_state, req.job_id, req.workload_key,
                     updated(prior, state="waiting", message=str(e)))
        raise task.retry(countdown=3) from e
    except RoundStopped:
        raise
    except FarmError as e:
        log.error("round %s of %s on %s failed: %s", req.round_index + 1, req.task_name,
                  ctx.host, e)
        _fail(store, req, ctx.host, str(e))
        raise
    except Exception as e:
        log.exception("round %s of %s on %s crashed", req.round_index + 1, req.task_name, ctx.host)
        _fail(store, req, ctx.host, f"round crashed on {ctx.host}: {type(e).__name__}: {e}")
        raise


def _fail(store: RecordStore, req: RoundRequest, host: str, message: str) -> None:
    """The task failed: say why; when it was the job's last task, finalize the job."""
    prior = store.task_states(req.job_id).get(req.workload_key, TaskState())
    best_effort(store.set_task_state, req.job_id, req.workload_key,
                 updated(prior, state="failed", host=host, message=message))
    job = store.get_job(req.job_id)
    if job is not None and finalize_stage.job_finished(store, job):
        best_effort(finalize_stage.finalize_job, store, job, f"worker {host}")


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
    failures = dict(prior.failures)
    for k, v in result.failures.items():
        failures[k] = failures.get(k, 0) + v
    best = store.best(req.workload_key)
    count = store.record_count(req.workload_key)
    gained = [best.run_us] if best and best.run_us and not result.skipped else []
    history = list(prior.history) + gained
    base = dict(failures=failures, device_lost=prior.device_lost + result.device_lost,
                best_us=best.run_us if best else None, host=result.host,
                rounds=max(prior.rounds, req.round_index + 1), history=history,
                measure_s=prior.measure_s + result.measure_s)
    budget = job.trials_budget if job else 0
    early = job.early_stop_rounds if job else 0
    spent = sum(store.job_measured(req.job_id).values()) if budget else 0
    if store.job_status(req.job_id).get("state") == "cancelled":
        state = updated(prior, state="failed", message="job cancelled", **base)
    elif count >= req.target_trials:
        state = updated(prior, state="done", message=f"{count} trials in store", **base)
    elif result.single_schedule and result.device_lost == 0 and count >= 1:
        best_effort(store.mark_exhausted, req.workload_key, count)
        state = updated(prior, state="exhausted", single_schedule=True,
                         message="one possible schedule: measured once", **base)
    elif (not result.skipped and result.device_lost == 0
          and result.measured + result.duplicates < result.requested):
        # MetaSchedule stopped before the trials asked for: no new candidate is left.
        best_effort(store.mark_exhausted, req.workload_key, count)
        state = updated(prior, state="exhausted",
                         message=f"search space exhausted after {count} distinct candidates",
                         **base)
    elif plan_stage.stopped_early(history, early):
        state = updated(prior, state="done",
                         message=f"stopped early: no gain in the last {early} rounds", **base)
    elif req.round_index + 1 >= req.max_rounds:
        state = updated(prior, state="exhausted",
                         message=f"{req.max_rounds} rounds used, {count} trials in store", **base)
    elif budget and spent >= budget:
        state = updated(prior, state="done", message=f"job budget of {budget} trials spent",
                         **base)
    elif budget:
        state = updated(prior, state="ready", message="ready for another round", **base)
    else:
        nxt = RoundRequest.from_json({**req.to_json(), "round_index": req.round_index + 1,
                                      "attempt": 0})
        # the state names the next round first: if this process dies before the send, the
        # supervisor finds a queued round with no live copy and sends it
        store.set_task_state(req.job_id, req.workload_key, updated(
            prior, state="queued", message=f"round {nxt.round_index + 1} queued",
            round=nxt.to_json(), **base))
        if store.claim(keys.round_sent(nxt.logical_id), ttl_s=keys.JOB_TTL_S):
            send_round(app, nxt, countdown_s=1.0 if result.device_lost else None)
        return
    best_effort(store.set_task_state, req.job_id, req.workload_key, state)
    log.info("job %s: %s is %s (%s)", req.job_id, req.task_name, state.state, state.message)
    if budget and job is not None:
        plan_next_round(app, store, job)
    if job is not None and finalize_stage.job_finished(store, job):
        # the last task ended: finalize here, so the job is finished even if no client waits
        best_effort(finalize_stage.finalize_job, store, job, f"worker {result.host}")


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
        pick = plan_stage.next_task({wk: (job.weights.get(wk, 1), s.history)
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
