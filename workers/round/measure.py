"""One measuring round: MetaSchedule on this host's phones, committing to the store.

A round is idempotent: it measures only what the workload still lacks
(target trials minus records in the store), and a candidate already stored is
never stored twice, so a redelivered round is harmless.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from farm.core.aliases import IRModule, JsonDict, Target
from farm.core.errors import ServiceError, TuneError, best_effort
from farm.core.messages import RoundRequest, RoundResult
from farm.core.profiles import DeviceProfile
from farm.devices import tracker as tracker_mod
from farm.devices.cross import build_reference
from farm.devices.hostcpu import missing_features, system_cpu
from farm.store import RecordStore, TaskState
from farm.store.jobs import JobWriter, added
from farm.store.store import FarmView, updated
from workers.metaschedule.callback import Provenance, RoundCounters, StoreCallback
from workers.metaschedule.identity import this_host
from workers.metaschedule.search import RoundFacts
from workers.round.account import RoundClock, account
from workers.round.context import WorkerContext
from workers.round.gate import phone_speed, rounds_at_once
from workers.round.handoff import checker
from workers.round.lend.phone_side import Helpers, LentRound, lend, lend_rounds, wanted
from workers.round.loop import BATCH, OnPhones, device_type
from workers.round.rounds import LEASE_TTL_S, Round
from workers.round.tuning import Where, Workload, search_round

if TYPE_CHECKING:
    from workers.metaschedule.runner import BoundedRPCRunner
    from workers.round.lend.phone_side import Lent

log = logging.getLogger(__name__)
ENDED = ("cancelled", "finalized", "failed")


class StaleRound(TuneError):
    """A round of an earlier run of a job that has been resumed since: the new run has its own."""


class LeaseBusy(TuneError):
    """Another job is tuning this workload right now; the round should wait for it."""

    def __init__(self, holder: str) -> None:
        super().__init__(f"job {holder} is tuning this workload; waiting for it")
        self.holder = holder


def has_single_schedule(mod: IRModule, target: Target) -> bool:
    """True when MetaSchedule's design space for `mod` is one schedule with no sampled decision
    (reshapes and the like): there is exactly one candidate to measure."""
    from tvm.s_tir import meta_schedule as ms

    try:
        ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply",
                             task_name="space")
        spaces = ctx.generate_design_space()
    except Exception as e:  # noqa: BLE001 - then tune it normally
        log.warning("design space of a workload could not be generated: %s", e)
        return False
    if len(spaces) != 1:
        return False
    return not any(inst.kind.name.startswith("Sample") for inst in spaces[0].trace.insts)


def wait_for_phone(ctx: WorkerContext, store: JobWriter, req: RoundRequest,
                   state: TaskState) -> int:
    """Phones of the request's key on this host's tracker; waits (bounded) when there are none."""
    deadline = time.monotonic() + ctx.config.device_wait_s
    announced = False
    while True:
        info = tracker_mod.phones(ctx.tracker).get(req.device_key)
        if info is not None and info.total > 0:
            return info.total
        if not announced:
            msg = f"waiting for a phone of key {req.device_key} on host {ctx.host}"
            log.warning("round %s: %s", req.round_id, msg)
            best_effort(store.set_task_state, req.job_id, req.workload_key,
                         updated(state, state="waiting", host=ctx.host, message=msg))
            announced = True
        if time.monotonic() >= deadline:
            raise ServiceError(f"no phone of key {req.device_key} on host {ctx.host} for "
                               f"{ctx.config.device_wait_s:.0f} s",
                               subject=f"tracker {ctx.tracker}",
                               hint="start the phones' RPC apps (or `farm phones`) with this key")
        time.sleep(1.0)


def check_cpu(profile: DeviceProfile, target: JsonDict, host: str) -> None:
    """Refuse a round of a profile whose phones run on this host's CPU (`host_cpu`: emulated
    phones) when its target needs instructions this CPU lacks: every candidate would crash
    the phones, or be measured on code built for another CPU."""

    if not profile.host_cpu:
        return
    missing = missing_features(target, system_cpu())
    if missing:
        raise TuneError(f"this host's CPU ({system_cpu() or 'generic'}) cannot run code for "
                        f"target mcpu={target.get('mcpu')}: it lacks {', '.join(missing)}",
                        subject=f"host {host}, device key {profile.key}",
                        hint="submit from (or for) a machine with that CPU, or give this host "
                             "its own device key")


def run_round(ctx: WorkerContext, store: RecordStore, req: RoundRequest,
              on_progress: Callable[[RoundCounters], None] | None = None) -> RoundResult:
    """Measure up to `req.trials` new candidates of one workload on this host's phones.

    Raises LeaseBusy when another job holds the workload's lease (it is tuning it now)."""
    t0 = time.monotonic()
    task = store.get_workload(req.workload_key)
    if task is None:
        raise TuneError("the workload is not in the store", subject=f"workload {req.workload_key}",
                        hint="resubmit the job: its plan was lost")
    job = store.get_job(req.job_id)
    if job is not None and job.run != req.run:
        raise StaleRound(f"round {req.round_id} belongs to run {req.run + 1}, the job is at run "
                         f"{job.run + 1}")
    prior = store.task_states(req.job_id).get(req.workload_key, TaskState())
    if store.job_status(req.job_id).get("state") == "cancelled":
        raise TuneError("the job was cancelled", subject=f"job {req.job_id}")
    missing = req.target_trials - store.record_count(req.workload_key)
    trials = min(req.trials, missing)
    if trials <= 0:
        return RoundResult(job_id=req.job_id, workload_key=req.workload_key,
                           round_index=req.round_index, host=ctx.host, measured=0, valid=0,
                           wall_s=time.monotonic() - t0, skipped=True)
    rnd = Round(ctx, store, req, task, prior, missing, trials, on_progress, t0)
    with _slot(ctx, store, req) as slot:
        if slot is not None and slot < 0:  # it waited for a slot while another host idled
            log.info("round %s of %s on %s: waited for a slot while another host of %s had "
                     "no round: handing it over", req.round_index + 1, req.task_name, ctx.host,
                     req.device_key)
            return replace(rnd.result(measured=0, valid=0), requested=trials, handed_off=True)
        return _leased(rnd)


def _slot(ctx: WorkerContext, store: FarmView,
          req: RoundRequest) -> AbstractContextManager[int | None]:
    """A slot of the host's gate (workers/round/gate.py): how many rounds run at once follows the
    phones' and the host's measured speed. No gate (a fixed --concurrency): no wait. A round
    that waits for one while another host of the key has no round hands itself over (-1)."""
    import contextlib

    gate = ctx.gate
    if gate is None:
        return contextlib.nullcontext()

    def open_slots() -> int:
        try:
            info = tracker_mod.phones(ctx.tracker).get(req.device_key)
        except ServiceError:  # the tracker is away a moment: keep the last decision
            return max(1, ctx.rounds_at_once)
        registered = info.phones if info is not None else ()
        profile = ctx.profile(req.device_key)
        speed = phone_speed(store, req.device_key, registered)
        n, why = rounds_at_once(speed, len(registered), gate.host_s(), profile.host_cpu,
                                gate.pool)
        lent = min(gate.lend_room, lend_rounds(ctx, store, profile, len(registered),
                                               lambda: speed)) if gate.lend_room else 0
        if lent:
            n, why = min(gate.pool, n + lent), f"{why}; {lent} more searched by helpers"
        if n != ctx.rounds_at_once:
            log.info("worker %s: %d round(s) at once: %s", ctx.host, n, why)
            ctx.rounds_at_once = n
        return n

    return gate.slot(req.device_key, open_slots, give_up=checker(ctx, store, req))


def _leased(rnd: Round) -> RoundResult:
    """The round under its workload's lease (one job tunes a workload at a time)."""
    ctx, store, req = rnd.ctx, rnd.store, rnd.req
    holder = store.acquire_lease(req.workload_key, req.job_id, LEASE_TTL_S)
    if holder is not None and store.job_status(holder).get("state") in ENDED:
        store.release_lease(req.workload_key, holder)  # its job is over: the lease is stale
        holder = store.acquire_lease(req.workload_key, req.job_id, LEASE_TTL_S)
    if holder is not None:
        raise LeaseBusy(holder)
    try:
        result = _tune(rnd)
    finally:
        best_effort(store.release_lease, req.workload_key, req.job_id)
    # the host's CPU per batch, its account's (a lent round's is the helper's, not measured here)
    if ctx.gate is not None and not result.skipped and not result.searched_by:
        ctx.gate.note_host_s(sum(result.cpu.values()), -(-result.requested // BATCH))
    return result


@dataclass
class Tuning:
    """A round's workload as it is tuned (workers/round/tuning.py), whether it has one possible
    schedule, the trials, the phones' runner and the store callback (with the round's
    counters)."""

    w: Workload
    single: bool
    trials: int
    runner: BoundedRPCRunner
    callback: StoreCallback

    @property
    def counters(self) -> RoundCounters:
        return self.callback.counters


def _tune(rnd: Round) -> RoundResult:
    ctx, store, req, task = rnd.ctx, rnd.store, rnd.req, rnd.task
    profile = ctx.profile(req.device_key)
    phones = _start(rnd, profile)
    w = Workload.load(store, task)
    single = has_single_schedule(w.mod, w.target)
    runner = ctx.runner(profile, phones)
    clock = RoundClock(ctx.builder(profile), runner)  # the round's CPU, per part
    # the runner: the batches' time on the phones, and which phone measured what
    callback = StoreCallback(store, w.tuned, Provenance(req.job_id, ctx.host, req.device_key,
                                                        task.name, req.round_id),
                             RoundCounters(), rnd.on_progress, runner,
                             this_host(ctx.host, profile))
    # one possible schedule: measure it once, never spin a search on it
    t = Tuning(w, single, 1 if single else rnd.trials, runner, callback)
    work_dir = tempfile.mkdtemp(prefix="farm-round-")
    runner.set_reference(None if single else _reference(w.mod, w.target, profile, work_dir, req))
    best_effort(runner.phone_log.refresh, store)  # the phones set aside by earlier rounds
    try:
        lent = None if single else _lent(rnd, t, profile, phones)
        lent_cpu = {"phones": clock.runner_s()}  # measuring what a helper searched
        # done: the helper's search ended, or its batches measured the whole round and only
        # its end was lost with it (else the rest here would measure one trial too many)
        if lent is not None and (lent.complete or lent.measured >= t.trials):
            return replace(_result(rnd, t.counters, lent.counts,
                                   RoundFacts(t.trials, ranked_by=lent.ranked_by)),
                           searched_by=lent.helper, cpu=account(lent_cpu, clock.total_s()),
                           helper_cpu=account(lent.cpu, sum(lent.cpu.values())))
        rest = t.trials - (lent.measured if lent is not None else 0)
        result, parts = _search_here(rnd, replace(t, trials=max(1, rest)), phones)
        result = replace(result, cpu=account(added(parts, lent_cpu), clock.total_s()))
        # the helper's part of it: it searched that much
        return replace(result, requested=t.trials, searched_by=lent.helper,
                       helper_cpu=account(lent.cpu, sum(lent.cpu.values()))) if lent else result
    except Exception as e:
        if t.counters.store_error is not None and t.counters.store_error is not e:
            raise t.counters.store_error from e  # the store's own error, not what it caused
        raise
    finally:
        runner.set_reference(None)
        runner.turns.end()  # a batch the round abandoned holds no other round's measurements
        shutil.rmtree(work_dir, ignore_errors=True)


def _lent(rnd: Round, t: Tuning, profile: DeviceProfile, phones: int) -> Lent | None:
    """The round's search and builds lent to a helper host (workers/round/lend/phone_side.py), when
    this host is short of cores and a helper has room; None: not lent."""

    alive = Helpers.read(rnd.store)
    why = wanted(rnd.ctx, rnd.store, profile, phones, alive)
    if why is None:
        return None
    lent = lend(LentRound(rnd, t.runner, t.callback, t.w.tuned, t.trials,
                          stop=checker(rnd.ctx, rnd.store, rnd.req)), device_type(t.w.target),
                alive.room)
    if lent is None:
        log.info("round %s of %s on %s: every helper's search sessions are taken; searching "
                 "here", rnd.req.round_index + 1, rnd.task.name, rnd.ctx.host)
        return None
    log.info("round %s of %s on %s: lent its search and builds to %s (%s)",
             rnd.req.round_index + 1, rnd.task.name, rnd.ctx.host, lent.helper or "no helper",
             why)
    if not lent.complete:
        log.warning("round %s of %s on %s: %s; searching the rest of the round here",
                    rnd.req.round_index + 1, rnd.task.name, rnd.ctx.host, lent.why)
    return lent


def _search_here(rnd: Round, t: Tuning, phones: int) -> tuple[RoundResult, dict[str, float]]:
    """The round's search and builds on this host, a batch ahead of its phones (and the CPU
    seconds of its parts)."""

    ctx, store, req = rnd.ctx, rnd.store, rnd.req
    where = Where(OnPhones(t.runner), t.callback, checker(ctx, store, req),
                  bool(ctx.config.search_ahead), t.callback.provenance.origins)
    facts, counts, parts = search_round(ctx, store, req, rnd.task, t.w, t.trials, where,
                                        t.single, phones)
    return _result(rnd, t.counters, counts, facts), parts


def _start(rnd: Round, profile: DeviceProfile) -> int:
    """Refuse a target this host's phones cannot run; wait for a phone of the key (bounded),
    then say the round is tuning; the phones."""
    ctx, store, req, prior = rnd.ctx, rnd.store, rnd.req, rnd.prior
    check_cpu(profile, rnd.task.target, ctx.host)
    phones = wait_for_phone(ctx, store, req, prior)
    try:  # a copy of it began tuning before (its process died, the store went away): a retry
        if store.round_tunings(req.logical_id, add=1):
            store.count_measurements(req.job_id, req.workload_key, retries=1)
    except Exception as e:  # noqa: BLE001 - the store restarting: the round still runs
        log.warning("round %s: retry not counted: %s", req.round_id, e)
    state = updated(prior, state="tuning", host=ctx.host, rounds=req.round_index + 1,
                     message=f"round {req.round_index + 1} of at most {req.max_rounds} on {ctx.host}")
    best_effort(store.set_task_state, req.job_id, req.workload_key, state)
    return phones


def _reference(mod: IRModule, target: Target, profile: DeviceProfile, work_dir: str,
               req: RoundRequest) -> str | None:
    """The reference kernel candidates' outputs are checked against (None: unchecked)."""
    if not profile.check_outputs:
        return None

    try:
        return build_reference(mod, target, profile, work_dir)
    except Exception as e:  # noqa: BLE001 - tune unchecked rather than not at all
        log.warning("round %s: no reference kernel for output checks: %s", req.round_id, e)
        return None


def _result(rnd: Round, counters: RoundCounters, counts: dict[str, int],
            facts: RoundFacts) -> RoundResult:
    ctx, req, task = rnd.ctx, rnd.req, rnd.task
    skipped = counts["skipped"]
    log.info("round %s of %s on %s: %d new records (%d valid, %d seeded from relatives, %d "
             "stored candidates skipped, %d duplicates, %d device lost), best %s us",
             req.round_index + 1, task.name, ctx.host, counters.new, counters.valid,
             counts.get("seeded", 0), skipped, counters.duplicates,
             counters.device_lost, f"{counters.best_us:.1f}" if counters.best_us else "-")
    return replace(
        rnd.result(measured=counters.new, valid=counters.valid), requested=facts.trials,
        duplicates=counters.duplicates, skipped_stored=skipped, single_schedule=facts.single,
        failures=dict(counters.failures), errors=dict(counters.errors),
        device_lost=counters.device_lost, best_us=counters.best_us,
        measure_s=counters.measure_s, ranked_by=facts.ranked_by,
        handed_off=bool(counts.get("handed_off")), seeded=int(counts.get("seeded", 0)))
