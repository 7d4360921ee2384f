"""A whole job, stage by stage: preflight -> ingest -> extract -> plan -> dispatch -> wait ->
finalize -> compile -> report.

`submit` is what `farm submit` runs. With no broker configured it brings up the
embedded farm for the job's lifetime; with one it only talks to the lab farm."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from farm.core.aliases import JsonDict
from farm.core.config import FarmConfig
from farm.core.errors import UnmeasuredError, UsageError
from farm.core.messages import JobSpec
from farm.core.profiles import DeviceProfile, resolve_profile
from farm.devices import cross
from farm.devices.evaluate import session_threads
from farm.devices.hostcpu import cpu_for_key, system_cpu
from farm.devices.opencl import fill_limits, leaves_out_limits
from farm.jobs import finalize as finalize_stage
from farm.jobs import plan as plan_stage
from farm.jobs.dispatch import send_round
from farm.pipeline import compile as compile_stage
from farm.pipeline import extract as extract_stage
from farm.pipeline import ingest as ingest_stage
from farm.pipeline import portable
from farm.pipeline import report as report_stage
from farm.pipeline.connect import Farm, connect
from farm.pipeline.extract import Prepared
from farm.pipeline.options import SubmitOptions
from farm.pipeline.preflight import (
    OUT_MARKER,
    check_out_dir,
    check_out_writable,
    name_held,
    preflight,
)
from farm.pipeline.reader import load_apart
from farm.pipeline.summary import JobOutcome, default_times, make_summary, phone_section
from farm.pipeline.wait import View, wait_for_job
from farm.store import StoreUnavailable, TaskState, configured_store

log = logging.getLogger(__name__)


CLIENT = f"client@{socket.gethostname()}"  # who finalized a job, when a client did


@dataclass(frozen=True)
class Submission:
    """A job as its client runs it: the options it was submitted (or is taken up again)
    with, the farm's config, where its progress lines go (`report`), the live view of its
    tasks (`view`; None: a line per change) and when the client started (`t0`, monotonic:
    the summary's wall time)."""

    opts: SubmitOptions
    config: FarmConfig
    say: Callable[[str], None] = print
    view: View | None = None
    t0: float = field(default_factory=time.monotonic)


def submit(opts: SubmitOptions, config: FarmConfig, say: Callable[[str], None] = print,
           resume: str | None = None, view: View | None = None) -> JsonDict:
    """Run a job end to end (or, with `resume`, the rest of an earlier job); return the
    summary (also written to <out>/summary.json)."""
    sub = Submission(opts, config, say, view)
    preflight(opts, config, say)  # bad input fails here: nothing started, nothing written
    # a lab farm: read the model before dispatching. The embedded farm starts first, so
    # that its worker warms up (TVM's tensor intrinsics: ~30 s) while the model is read.
    prep = prepare(sub, opts.tracker) if config.broker_url else None
    with connect(config, opts.tracker, opts.wait_for_devices_s) as farm:
        if prep is None:  # the embedded farm's phones register meanwhile
            if needs_a_phone(config):  # ... unless a phone must tell the GPU's limits first
                farm.ready()
            prep = prepare(sub, farm.tracker)
        farm.ready()
        job = dispatch_job(farm, sub, prep, resume)
        if not opts.wait:  # a lab farm (preflight refuses --no-wait on an embedded one)
            return {"job_id": job.job_id, "state": "submitted"}
        try:
            return complete(farm, job, prep, sub)
        except BaseException:
            if farm.embedded:  # nobody else will finish this job: its queued rounds must
                # not run in the next embedded farm (its records stay in the store)
                with contextlib.suppress(Exception):
                    if farm.store.job_status(job.job_id).get("state") != "failed":
                        farm.store.set_job_status(job.job_id, state="cancelled",
                                                  message="the submitting farm stopped")
            raise


def needs_a_phone(config: FarmConfig) -> bool:
    """The profile is a GPU's that leaves out limits a phone must tell (`prepare`)."""

    return leaves_out_limits(resolve_profile(config.device_key, config.profiles).target)


def prepare(sub: Submission, tracker: str | None = None) -> Prepared:
    """Stages 1 (ingest, torch) and 2 (extract, TVM). For a lab farm before the farm is
    contacted; for the embedded one while its worker warms up (see `submit`). A GPU profile
    that leaves out its limits takes them from a phone of `tracker`."""

    opts, say = sub.opts, sub.say
    profile = tuned_profile(sub.config, say, opts.target_cpu)
    target = fill_limits(profile.target, profile.key, tracker)
    if target != profile.target:
        profile = replace(profile, target=target)
        say(f"device key {profile.key}: the GPU's limits read from a phone: "
               + ", ".join(f"{k} {target[k]}" for k in ("max_threads_per_block",
                                                         "max_shared_memory_per_block")))
    # in a child process that holds no secret of the farm (farm/pipeline/reader.py)
    bundle = load_apart(opts.model, ingest_stage.parse_shapes(opts.input_shape), opts.dtype,
                        opts.allow_pickle, threads=profile.threads, hide=[sub.config.home])
    say(f"ingest: {opts.model} ({bundle.fmt}), inputs "
           f"{[list(x.shape) for x in bundle.inputs]}, torch {bundle.torch_us:.0f} us")
    extracted = extract_stage.extract(bundle.mod, profile, bundle.name)
    say(f"extract: {len(extracted.tasks)} tuning tasks for device key {profile.key}")
    return Prepared(bundle=bundle, extracted=extracted, profile=profile)


def tuned_profile(config: FarmConfig, say: Callable[[str], None],
                  cpu: str | None = None) -> DeviceProfile:
    """The profile of config.device_key for the CPU it is tuned for: `cpu` (a resumed job's
    own), else `target_cpu`."""
    return resolve_profile(config.device_key, config.profiles).on_cpu(
        cpu if cpu is not None else target_cpu(config, say))


def target_cpu(config: FarmConfig, say: Callable[[str], None]) -> str:
    """The CPU a `host_cpu` profile (cpu-local) is tuned for: this machine's for the embedded
    farm; on a lab farm, the CPU the hosts with phones of the key report in their heartbeats
    (this machine's when none does)."""

    if not config.broker_url:
        return system_cpu()
    store = configured_store(config)
    try:
        found = cpu_for_key(store.hosts(), config.device_key)
    finally:
        store.close()
    if found is None:
        say(f"no worker host reports its CPU for key {config.device_key}: tuning for this "
               f"machine's ({system_cpu() or 'generic'})")
        return system_cpu()
    return found


def check_same_tasks(job: JobSpec, prep: Prepared, model: Path) -> None:
    """A job taken up again must be the same model: the same tuning tasks, in order."""
    if [t.workload_key for t in prep.extracted.tasks] != job.workload_keys:
        raise UsageError(f"{model} no longer gives the job's tuning tasks (was it changed?)",
                         subject=f"job {job.job_id}", hint="submit it as a new job")


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def dispatch_job(farm: Farm, sub: Submission, prep: Prepared,
                 resume: str | None = None) -> JobSpec:
    """Stages 3 (plan: the store says what is already tuned) and 4 (dispatch: one message per
    task's first round; further rounds chain on the workers). With `resume`, the job keeps its
    id and starts its next run: rounds of an earlier run are stale and skipped."""
    opts, config, tasks, profile = sub.opts, sub.config, prep.extracted.tasks, prep.profile
    job_id, run = new_job_id(), 0
    if resume is not None:
        old = farm.store.require_job(resume)
        check_same_tasks(old, prep, opts.model)
        job_id, run = resume, old.run + 1
        farm.store.reset_job(job_id)
    if opts.name and (holder := farm.store.claim_name(opts.name, job_id)) is not None:
        raise name_held(opts.name, holder)
    plans = plan_stage.plan(
        tasks, {t.workload_key: farm.store.record_count(t.workload_key) for t in tasks},
        {t.workload_key for t in tasks if farm.store.exhausted(t.workload_key)},
        opts.trials_per_task, config.round_trials)
    plans, budget, first_round = plan_stage.split_budget(
        plans, opts.trials_budget, opts.trials_per_task, config.round_trials)
    todo = [p for p in plans if not p.cached]
    job = JobSpec(
        job_id=job_id, model=prep.bundle.name, device_key=profile.key,
        target=profile.target_json(), trials_per_task=opts.trials_per_task,
        round_trials=config.round_trials, workload_keys=[t.workload_key for t in tasks],
        task_names={t.workload_key: t.name for t in tasks},
        weights={t.workload_key: t.weight for t in tasks}, created_at=time.time(),
        max_rounds=max((p.max_rounds for p in plans), default=0),
        trials_budget=budget, early_stop_rounds=opts.early_stop_rounds,
        priority=opts.priority, run=run, options=opts.to_job_options(),
    )
    farm.store.put_job(job)
    farm.store.set_job_status(job_id, state="running", started_at=str(time.time()),
                              run=str(run), message="")
    farm.store.set_active(job_id, True)  # the farm's supervisor looks after it from now on
    send_first_rounds(farm, job, plans, first_round)
    planned = budget or sum(p.needed for p in plans)
    verb = f"resumed (run {run + 1})" if resume else "submitted"
    sub.say(f"plan: job {job_id} {verb}: {planned} trials to measure, "
               f"{sum(1 for p in plans if p.cached)} of {len(plans)} tasks from the store")
    if not todo:  # nothing to tune: the job is finished now
        finalize_stage.finalize_job(farm.store, job, by=CLIENT)
    return job


DISPATCH_PATIENCE_S = 60.0  # the store or the broker restarting while the first rounds go out


def send_first_rounds(farm: Farm, job: JobSpec, plans: list[plan_stage.TaskPlan],
                      first_round: int) -> None:
    """Stage 4: a task already in the store is done; every other gets its first round (of a
    job budget, what `allocate` grants it). Later rounds chain on the workers. A store or
    broker that is away a moment (a restart) is waited for, up to DISPATCH_PATIENCE_S per
    task: the job is in the store already, and a client that gave up here left it half sent."""
    for p in plans:
        patiently(functools.partial(_send_first, farm, job, p, first_round),
                  f"job {job.job_id}: task {p.task.name}'s first round")


def _send_first(farm: Farm, job: JobSpec, p: plan_stage.TaskPlan, first_round: int) -> None:
    job_id, budget = job.job_id, job.trials_budget
    farm.store.put_workload(p.task, job_id)
    if p.cached:
        farm.store.set_task_state(job_id, p.task.workload_key, TaskState(
            state="done", message=f"from store ({p.in_store} trials)",
            updated_at=time.time()))
        return
    trials = min(first_round, p.needed)
    if budget:
        trials = farm.store.allocate(job_id, trials, budget)
        if trials == 0:
            farm.store.set_task_state(job_id, p.task.workload_key, TaskState(
                state="done", message="job budget allocated to other tasks",
                updated_at=time.time()))
            return
    first = plan_stage.round_of(job, p.task.workload_key, 0, trials, p.max_rounds)
    # the state names the round before it is sent: a lost send is the supervisor's to redo
    farm.store.set_task_state(job_id, p.task.workload_key, TaskState(
        state="queued", message="round 1 queued", updated_at=time.time(),
        round=first.to_json()))
    send_round(farm.app, first)


def patiently(step: Callable[[], None], what: str,
              patience_s: float = DISPATCH_PATIENCE_S) -> None:
    """`step()`, again while the store or the broker is unreachable (with a growing pause), for
    up to `patience_s`; then their error. Each step may run twice: it must be idempotent
    (a job budget's `allocate` that reached Redis before the connection broke is counted
    twice: the job measures less of its budget, never more)."""
    from kombu.exceptions import OperationalError

    deadline, pause = time.monotonic() + patience_s, 0.5
    while True:
        try:
            step()
            return
        except (StoreUnavailable, OperationalError) as e:
            if time.monotonic() + pause > deadline:
                raise
            log.warning("%s: the store or the broker is away (%s): again in %.1f s", what, e,
                        pause)
            time.sleep(pause)
            pause = min(5.0, 2 * pause)


def complete(farm: Farm, job: JobSpec, prep: Prepared, sub: Submission) -> JsonDict:
    """Stages 5-7 for a dispatched job: wait for the workers (the store is the truth, not a
    chord callback), finalize (once per job, whoever comes first), compile and check against
    torch, write <out>. Used by `farm submit`, `farm resume` and `farm wait`."""
    opts, config, say, tasks = sub.opts, sub.config, sub.say, prep.extracted.tasks
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{opts.out.name}.partial-", dir=opts.out.parent))
    try:
        t_tune = time.monotonic()
        wait_for_job(farm, job, say, opts.timeout_s, view=sub.view,
                     full_grace_s=config.supervisor_interval_s + config.host_ttl_s)
        tuning_s = time.monotonic() - t_tune
        # 6. finalize: the job's best record per workload (fixed once) -> one JSONDatabase.
        picks = finalize_stage.finalize_job(farm.store, job, by=CLIENT)
        states = farm.store.task_states(job.job_id)
        verdict = finalize_stage.unmeasured(job, states)
        if verdict.nothing:  # an untuned model is no result: say what the phones said
            raise UnmeasuredError(
                f"no task got one valid measurement ({verdict.searched} went to the phones): "
                f"{verdict.line(job.device_key, farm.tracker or 'HOST:PORT')}",
                subject=f"job {job.job_id}")
        unusable: dict[str, str] = {}  # workload key -> why its best record was not applied
        bests = finalize_stage.write_best_log(farm.store, tasks, staging / "best", picks, unusable)
        portable.save(staging / "best", prep.extracted.fused, prep.profile.target_json())
        measured = farm.store.job_measured(job.job_id)
        from_store = {t.workload_key: max(0, farm.store.record_count(t.workload_key)
                                          - measured.get(t.workload_key, 0)) for t in tasks}
        # 7. compile, check against torch, benchmark on a phone of the key.
        say("compile: building tuned and untuned models, checking against torch")
        result = compile_stage.compile_and_check(compile_stage.ModelCheck(
            fused=prep.extracted.fused, target_json=prep.profile.target_json(),
            log_dir=staging / "best", out_dir=staging, inputs=prep.bundle.inputs,
            expected=prep.bundle.outputs, task_names={t.workload_key: t.name for t in tasks},
            tuned_names={t.name for t in tasks if bests.get(t.workload_key) is not None},
            untunable=prep.extracted.untunable, tracker=farm.tracker, device_key=prep.profile.key,
            fcompile=cross.fcompile(prep.profile), threads=session_threads(prep.profile)))
        result.fallback.update({t.name: unusable[t.workload_key] for t in tasks
                                if t.workload_key in unusable})
        wall_s = time.monotonic() - sub.t0
        summary = make_summary(job, prep, JobOutcome(
            states=states, measured=measured, from_store=from_store, bests=bests,
            counts=farm.store.job_counts(job.job_id), defaults=default_times(farm.store, tasks),
        ), result, wall_s)
        summary["tuning_s"] = round(tuning_s, 1)
        summary["unmeasured_tasks"] = verdict.tasks  # went to the phones, nothing valid back
        summary.update(phone_section(farm.store, job))
        summary["out"] = str(opts.out)
        report_stage.write(staging, summary, farm.store)
        (staging / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=False))
        (staging / OUT_MARKER).write_text(job.job_id + "\n")  # resume may replace it
        if opts.out.exists():
            shutil.rmtree(opts.out)
        staging.rename(opts.out)
        with contextlib.suppress(Exception):
            farm.store.set_job_status(job.job_id, out=str(opts.out.resolve()),
                                      compiled_at=str(time.time()))
        return summary
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def follow(job_id: str, config: FarmConfig, say: Callable[[str], None],
           out: Path | None = None, force: bool = False,
           timeout_s: float | None = None, allow_pickle: bool = False,
           view: View | None = None) -> JsonDict:
    """`farm wait JOB`: the client's part of a lab job whose submitting client died or did not
    wait. Waits for it (the farm's supervisor re-sends lost rounds and finalizes it; finalize
    here too, once per job, is a no-op then), and when its model file is readable here,
    compiles it into <out> (default: the job's own --out) like `farm submit` would. `view`:
    as `submit`'s."""
    t0 = time.monotonic()
    if not config.broker_url:
        raise UsageError("`farm wait` follows a job on a lab farm; an embedded farm stops with "
                         "its `farm submit`", subject=f"job {job_id}",
                         hint=f"`farm resume {job_id}` continues it on a new embedded farm")
    with connect(config, require_devices=False) as farm:
        job = farm.store.require_job(job_id)  # an id or a name
        job_id = job.job_id
        opts = SubmitOptions.from_job(job, out=out, force=force, timeout_s=timeout_s,
                                      allow_pickle=allow_pickle)
        farm.tracker = opts.tracker
        if opts.model.is_file():
            check_out_dir(opts.out, opts.force)
            check_out_writable(opts.out, [opts.model, Path(config.home)])
            # the job's own device key (its profile); the rest of the config as it is here
            sub = Submission(opts, replace(config, device_key=job.device_key), say,
                             view=view, t0=t0)
            prep = prepare(sub, opts.tracker)
            check_same_tasks(job, prep, opts.model)
            return complete(farm, job, prep, sub)
        wait_for_job(farm, job, say, timeout_s, view=view)
        picks = finalize_stage.finalize_job(farm.store, job, by=CLIENT)
        say(f"job {job_id}: finalized ({len(picks)} of {len(job.workload_keys)} tasks have a "
               f"best record); {opts.model} is not readable here, so it was not compiled")
        return {"job_id": job_id, "state": "finalized", "best_records": len(picks)}
