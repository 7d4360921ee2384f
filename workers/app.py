"""The Celery side of a worker host: the round task and its continuation.

Process state: each pool process keeps one `WorkerContext` (warm builder,
runner, TVM) in `_PROCESS`, set up by `worker_process_init`; nothing else is global.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from celery import signals

from farm import finalize as finalize_stage
from farm import keys
from farm import plan as plan_stage
from farm.config import FarmConfig
from farm.dispatch import ROUND_TASK, make_app, send_round
from farm.errors import FarmError
from farm.messages import JobSpec, RoundRequest, RoundResult
from farm.store import RecordStore, TaskState, open_store
from workers.measure import (
    LEASE_TTL_S,
    LeaseBusy,
    StaleRound,
    WorkerContext,
    _best_effort,
    _replace,
    run_round,
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
    """One round of one workload. Safe to run twice (see workers/measure.py)."""
    req = RoundRequest.from_json(payload)
    ctx, store = _context()

    def progress(c: Any) -> None:
        meta = {"job": req.job_id, "task": req.task_name, "round": req.round_index + 1,
                "trials_done": c.new + c.duplicates, "trials_total": req.trials,
                "best_us": c.best_us, "host": ctx.host, "device_key": req.device_key}
        _best_effort(store.acquire_lease, req.workload_key, req.job_id, LEASE_TTL_S)  # renew
        _best_effort(self.update_state, None, "PROGRESS", meta)
        _best_effort(self.send_event, "task-progress", **meta)
        prior = store.task_states(req.job_id).get(req.workload_key, TaskState())
        best = f", best {c.best_us:.1f} us" if c.best_us else ""
        _best_effort(store.set_task_state, req.job_id, req.workload_key, _replace(
            prior, state="tuning", host=ctx.host,
            message=f"round {req.round_index + 1}: {c.new + c.duplicates}/{req.trials} trials "
                    f"on {ctx.host}{best}"))

    try:
        result = run_round(ctx, store, req, on_progress=progress)
    except StaleRound as e:
        log.info("skipped: %s", e)
        return {"skipped": str(e)}
    except redis.RedisError as e:
        # The store went away mid-round (Redis restarting): records committed so far are kept;
        # run the round again later, it measures only what is still missing.
        log.warning("round %s of %s on %s: store unreachable (%s); retrying in 10 s",
                    req.round_index + 1, req.task_name, ctx.host, e)
        raise self.retry(countdown=10, max_retries=60) from e
    except LeaseBusy as e:
        prior = store.task_states(req.job_id).get(req.workload_key, TaskState())
        _best_effort(store.set_task_state, req.job_id, req.workload_key,
                     _replace(prior, state="waiting", message=str(e)))
        raise self.retry(countdown=3) from e
    except FarmError as e:
        log.error("round %s of %s on %s failed: %s", req.round_index + 1, req.task_name,
                  ctx.host, e)
        prior = store.task_states(req.job_id).get(req.workload_key, TaskState())
        _best_effort(store.set_task_state, req.job_id, req.workload_key,
                     _replace(prior, state="failed", host=ctx.host, message=str(e)))
        raise
    except Exception as e:
        log.exception("round %s of %s on %s crashed", req.round_index + 1, req.task_name, ctx.host)
        prior = store.task_states(req.job_id).get(req.workload_key, TaskState())
        _best_effort(store.set_task_state, req.job_id, req.workload_key,
                     _replace(prior, state="failed", host=ctx.host,
                              message=f"round crashed on {ctx.host}: {type(e).__name__}: {e}"))
        raise
    continue_job(_PROCESS["app"], store, req, result)
    return result.to_json()


def continue_job(app: Any, store: RecordStore, req: RoundRequest, result: RoundResult) -> None:
    """After a round: the workload is done, exhausted, stopped, or gets its next round.

    Per-task budgets: the workload's own next round is sent (once: a claimed key).
    A job budget (`--trials N`): the finished task becomes `ready`, and the planner
    gives the job's next round to the ready task where a round pays most.
    """
    job = store.get_job(req.job_id)
    prior = store.task_states(req.job_id).get(req.workload_key, TaskState())
    failures = dict(prior.failures)
    for k, v in result.failures.items():
        failures[k] = failures.get(k, 0) + v
    best = store.best(req.workload_key)
    count = store.record_count(req.workload_key)
    history = list(prior.history) + ([best.run_us] if best and best.run_us else [])
    base = dict(failures=failures, device_lost=prior.device_lost + result.device_lost,
                best_us=best.run_us if best else None, host=result.host,
                rounds=max(prior.rounds, req.round_index + 1), history=history,
                measure_s=prior.measure_s + result.measure_s)
    budget = job.trials_budget if job else 0
    early = job.early_stop_rounds if job else 0
    spent = sum(store.job_measured(req.job_id).values()) if budget else 0
    if store.job_status(req.job_id).get("state") == "cancelled":
        state = _replace(prior, state="failed", message="job cancelled", **base)
    elif count >= req.target_trials:
        state = _replace(prior, state="done", message=f"{count} trials in store", **base)
    elif result.single_schedule and result.device_lost == 0 and count >= 1:
        _best_effort(store.mark_exhausted, req.workload_key, count)
        state = _replace(prior, state="exhausted", single_schedule=True,
                         message="one possible schedule: measured once", **base)
    elif (not result.skipped and result.device_lost == 0
          and result.measured + result.duplicates < result.requested):
        # MetaSchedule stopped before the trials asked for: no new candidate is left.
        _best_effort(store.mark_exhausted, req.workload_key, count)
        state = _replace(prior, state="exhausted",
                         message=f"search space exhausted after {count} distinct candidates",
                         **base)
    elif plan_stage.stopped_early(history, early):
        state = _replace(prior, state="done",
                         message=f"stopped early: no gain in the last {early} rounds", **base)
    elif req.round_index + 1 >= req.max_rounds:
        state = _replace(prior, state="exhausted",
                         message=f"{req.max_rounds} rounds used, {count} trials in store", **base)
    elif budget and spent >= budget:
        state = _replace(prior, state="done", message=f"job budget of {budget} trials spent",
                         **base)
    elif budget:
        state = _replace(prior, state="ready", message="ready for another round", **base)
    else:
        nxt = RoundRequest.from_json({**req.to_json(), "round_index": req.round_index + 1})
        state = _replace(prior, state="queued", message=f"round {nxt.round_index + 1} queued",
                         **base)
        _best_effort(store.set_task_state, req.job_id, req.workload_key, state)
        if store.claim(keys.round_next(req.round_id), ttl_s=keys.JOB_TTL_S):
            send_round(app, nxt, countdown_s=1.0 if result.device_lost else None)
        return
    _best_effort(store.set_task_state, req.job_id, req.workload_key, state)
    log.info("job %s: %s is %s (%s)", req.job_id, req.task_name, state.state, state.message)
    if budget and job is not None:
        plan_next_round(app, store, job, req, budget, spent)
    if job is not None and finalize_stage.job_finished(store, job):
        # the last task ended: finalize here, so the job is finished even if no client waits
        _best_effort(finalize_stage.finalize_job, store, job, f"worker {result.host}")


IN_FLIGHT = 2  # rounds of one budgeted job in flight at once (keeps the phones busy)


def plan_next_round(app: Any, store: RecordStore, job: JobSpec, req: RoundRequest, budget: int,
                    spent: int) -> None:
    """Job budget: once every task has had its first round, keep IN_FLIGHT rounds going, each
    given to the ready task where a round pays most; close the job's tasks when it is spent."""
    states = store.task_states(job.job_id)
    ready = {wk: s for wk, s in states.items() if s.state == "ready"}
    busy = [wk for wk, s in states.items() if s.state in ("queued", "tuning", "waiting")]
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
        index = state.rounds
        if not store.claim(keys.round_next(f"{job.job_id}:{pick}:{index}"), ttl_s=keys.JOB_TTL_S):
            continue
        granted = store.allocate(job.job_id, job.round_trials, budget)
        if granted == 0:  # the whole budget is given to rounds: nothing more to plan
            _close(store, job, {pick: state, **ready}, f"job budget of {budget} trials used")
            return
        nxt = RoundRequest.from_json({**req.to_json(), "workload_key": pick,
                                      "task_name": job.task_names.get(pick, pick),
                                      "round_index": index, "trials": granted})
        _best_effort(store.set_task_state, job.job_id, pick,
                     _replace(state, state="queued", message=f"round {index + 1} queued"))
        send_round(app, nxt)
        busy.append(pick)


def _close(store: RecordStore, job: JobSpec, tasks: dict[str, TaskState], why: str) -> None:
    for wk, s in tasks.items():
        _best_effort(store.set_task_state, job.job_id, wk, _replace(s, state="done", message=why))
