"""The Celery side of a worker host: the round task and its continuation.

Process state is one `RoundProcess`, made by `build_app` and handed to the round task and to
Celery's `worker_process_init`: each pool process keeps its own `WorkerContext` (warm
builder, runner, TVM) and store client in it; nothing is global.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from celery import signals

from farm.core.aliases import CeleryApp, CeleryTask, JsonDict
from farm.core.config import FarmConfig
from farm.core.errors import FarmError, best_effort
from farm.core.messages import RoundRequest, RoundResult
from farm.jobs import finalize as finalize_stage
from farm.jobs.advance import continue_job
from farm.jobs.dispatch import ROUND_TASK, SEARCH_TASK, make_app
from farm.jobs.fence import RoundFence, RoundStopped
from farm.store import RecordStore, StoreUnavailable, TaskState, configured_store
from farm.store.store import RecordsAndJobs, updated
from workers.metaschedule import costmodel
from workers.round.context import WorkerContext
from workers.round.gate import Gate
from workers.round.handoff import HOLD_S
from workers.round.lend.helper_side import serve_session
from workers.round.measure import LeaseBusy, StaleRound, run_round
from workers.round.rounds import LEASE_TTL_S

if TYPE_CHECKING:
    from workers.metaschedule.callback import RoundCounters

log = logging.getLogger(__name__)


class TvmChatter(logging.Filter):
    """MetaSchedule prints its INFO and DEBUG lines on stdout, which Celery logs as warnings of
    `celery.redirected`: half of a worker's log, and real warnings drowned in "The workload
    cannot be tensorized". Dropped here (they stay in MetaSchedule's own log files); its
    warnings and errors, and anything else printed, still come through."""

    LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(,\d+)? \[(INFO|DEBUG)\] ")

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.LINE.match(record.getMessage())


logging.getLogger("celery.redirected").addFilter(TvmChatter())


@dataclass
class RoundProcess:
    """What the worker's round processes share, set in its main process before the pool
    forks (the config, the tracker, the node's name, the gate's folder, the Celery app), and
    what each of them keeps for its whole life: its `WorkerContext` and its store client,
    made after the fork (`start`), or at the first round (a solo pool, a missed signal)."""

    config: FarmConfig
    tracker: str
    node: str
    app: CeleryApp
    gate_dir: str | None = None  # the worker's gate (workers/round/gate.py); None: no gate
    ctx: WorkerContext | None = None
    store: RecordStore | None = None

    def start(self, **_: object) -> None:
        """Celery's worker_process_init, in each new pool process: its context, warm."""
        ctx = self.ctx = self._new_context()
        self.store = configured_store(self.config)
        if ctx.gate is not None and not ctx.gate.first_to("warm"):
            return  # a gated worker warms one process now; the others pay it in their first
            # round, if the gate ever runs rounds at once (on 2 cores, warming 3 at once is slow)
        try:
            ctx.warm()
        except Exception as e:  # noqa: BLE001 - warming is an optimisation; the round says why
            log.warning("worker %s: warm-up failed: %s", ctx.host, e)

    def context(self) -> tuple[WorkerContext, RecordStore]:
        if self.ctx is None or self.store is None:  # solo pool or a missed signal
            self.ctx = self._new_context()
            self.store = configured_store(self.config)
        return self.ctx, self.store

    def _new_context(self) -> WorkerContext:
        ctx = WorkerContext(config=self.config, tracker=self.tracker, host=self.node,
                            app=self.app)
        if self.gate_dir:
            ctx.gate = Gate(self.gate_dir, pool=self.config.worker_concurrency)
        return ctx


def build_app(config: FarmConfig, tracker: str, node: str,
              gate_dir: str | None = None) -> CeleryApp:
    """The worker's Celery app; with `gate_dir`, its rounds take slots of the worker's gate
    there (how many run at once follows the measured speeds, workers/round/gate.py)."""
    app = make_app(config)
    process = RoundProcess(config, tracker, node, app, gate_dir)
    signals.worker_process_init.connect(process.start, weak=False)

    def round_task(self: CeleryTask, payload: JsonDict) -> JsonDict:
        return tune_round(process, self, payload)

    def search_task(payload: JsonDict) -> JsonDict:

        ctx, store = process.context()
        try:
            return serve_session(ctx, store, payload)
        finally:  # the key's model a lent round ranked with, stale: retrained now
            costmodel.train_pending(store, ctx.config.search_threads)

    # max_retries=None: a round waiting for another job's lease retries until the lease is free
    app.task(name=ROUND_TASK, bind=True, acks_late=True, reject_on_worker_lost=True,
             max_retries=None)(round_task)
    # a lent round's search (helper hosts): its phone host searches the rest itself should the
    # helper die, so a copy redelivered later finds its session closed and ends at once
    app.task(name=SEARCH_TASK, acks_late=True, reject_on_worker_lost=True)(search_task)
    return app


def tune_round(process: RoundProcess, task: CeleryTask, payload: JsonDict) -> JsonDict:
    """One round of one workload, fenced (farm/jobs/fence.py): a copy of a round that is done,
    running elsewhere, or no longer the task's current round does not run."""
    req = RoundRequest.from_json(payload)
    ctx, store = process.context()
    prior = store.task_states(req.job_id).get(req.workload_key, TaskState())
    current = RoundRequest.from_json(prior.round).logical_id if prior.round else req.logical_id
    if current != req.logical_id or prior.terminal:
        log.info("round %s of %s: skipped, the task is %s (current round %s)", req.round_id,
                 req.task_name, prior.state, current)
        return {"skipped": "superseded"}
    fence = RoundFence(store, req, ctx.host, ttl_s=ctx.config.host_ttl_s)
    verdict = fence.enter()
    if verdict == "done":
        if prior.outstanding:  # it ran, but the job did not go on (its worker died)
            continue_job(process.app, store, req, RoundResult(
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
        if fence.took_over and not store.round_tunings(req.logical_id):
            # its process died before it began tuning (waiting for a slot or a phone): it runs
            # again, a retry (one that had begun counts when it begins again: measure.py)
            best_effort(store.count_measurements, req.job_id, req.workload_key, retries=1)
        result = _run(task, ctx, store, req, fence)
        if result is None:
            return {"skipped": "stale"}
        done = True
    finally:
        finished = fence.exit(done)
    if not finished:  # fenced out: the copy that holds the round moves the job on
        return {"skipped": "fenced out"}
    continue_job(process.app, store, req, result)
    # the key's model, where the round ranked with a stale one: after the round is done
    costmodel.train_pending(store, ctx.search_threads(ctx.profile(req.device_key)))
    if result.handed_off:  # stay busy a moment: the idle host, not this one, takes the rest
        time.sleep(HOLD_S)
    return result.to_json()


def _run(task: CeleryTask, ctx: WorkerContext, store: RecordStore, req: RoundRequest,
         fence: RoundFence) -> RoundResult | None:
    def progress(c: RoundCounters) -> None:
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
    except StoreUnavailable as e:
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


def _fail(store: RecordsAndJobs, req: RoundRequest, host: str, message: str) -> None:
    """The task failed: say why; when it was the job's last task, finalize the job."""
    prior = store.task_states(req.job_id).get(req.workload_key, TaskState())
    best_effort(store.set_task_state, req.job_id, req.workload_key,
                 updated(prior, state="failed", host=host, message=message))
    job = store.get_job(req.job_id)
    if job is not None and finalize_stage.job_finished(store, job):
        best_effort(finalize_stage.finalize_job, store, job, f"worker {host}")


