"""A whole job, stage by stage: ingest -> extract -> plan -> dispatch -> wait -> finalize -> compile.

`submit` is what `farm submit` runs. With no broker configured it brings up the
embedded farm for the job's lifetime; with one it only talks to the lab farm.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from farm import compile as compile_stage
from farm import cross
from farm import extract as extract_stage
from farm import finalize as finalize_stage
from farm import ingest as ingest_stage
from farm import plan as plan_stage
from farm import report as report_stage
from farm.config import FarmConfig
from farm.dispatch import make_app, send_round
from farm.errors import ServiceError, StoreError, TuneError, UsageError
from farm.messages import PRIORITIES, JobSpec, RoundRequest
from farm.profiles import canonical_target, known_keys, resolve_profile
from farm.store import RecordStore, TaskState, open_store
from farm.store.store import MEASURE_COUNTERS, total_counts

log = logging.getLogger(__name__)
CLIENT = f"client@{socket.gethostname()}"  # who finalized a job, when a client did
STORE_OUTAGE_S = 180.0  # how long a waiting client tolerates an unreachable store


@dataclass(frozen=True)
class SubmitOptions:
    model: Path
    out: Path
    trials_per_task: int = 32  # per-task budget (the cap of each task in budget mode)
    trials_budget: int = 0  # > 0: a job budget spent by the planner (--trials N)
    early_stop_rounds: int = 0  # > 0: stop a task after this many rounds without gain
    input_shape: str | None = None
    dtype: str = "float32"
    allow_pickle: bool = False
    force: bool = False
    wait: bool = True
    timeout_s: float | None = None  # None: wait as long as the job runs
    tracker: str | None = None  # lab mode: where to run the compiled model (None: this CPU)
    wait_for_devices_s: float = 0.0  # lab mode: wait for a host with phones of the key
    priority: str = "normal"  # high | normal | low (PRIORITIES)
    live: bool = False  # redraw a per-task view on stderr while waiting (a terminal)
    # the CPU a host_cpu profile is tuned for (None: found now, see target_cpu); a resumed
    # job keeps its own
    target_cpu: str | None = None

    def to_job_options(self) -> dict[str, Any]:
        """What `farm resume` and `farm wait` need to redo the client's part of the job."""
        return {"model": str(self.model.resolve()), "out": str(self.out.resolve()),
                "trials_per_task": self.trials_per_task, "trials_budget": self.trials_budget,
                "early_stop_rounds": self.early_stop_rounds, "input_shape": self.input_shape,
                "dtype": self.dtype, "allow_pickle": self.allow_pickle, "tracker": self.tracker,
                "priority": self.priority}

    @classmethod
    def from_job(cls, job: JobSpec, out: Path | None = None, **changes: Any) -> SubmitOptions:
        o = job.options
        if not o.get("model"):
            raise StoreError("the job does not record how it was submitted",
                             subject=f"job {job.job_id}", hint="submit the model again")
        return cls(model=Path(o["model"]), out=out or Path(o["out"]),
                   trials_per_task=int(o.get("trials_per_task", job.trials_per_task)),
                   trials_budget=int(o.get("trials_budget", 0)),
                   early_stop_rounds=int(o.get("early_stop_rounds", 0)),
                   input_shape=o.get("input_shape"), dtype=o.get("dtype", "float32"),
                   allow_pickle=bool(o.get("allow_pickle")), tracker=o.get("tracker"),
                   priority=o.get("priority", "normal"),
                   target_cpu=str(job.target.get("mcpu", "")), **changes)


@dataclass
class Prepared:
    """A model ingested (torch) and split into tuning tasks (TVM) for one device profile."""

    bundle: Any
    extracted: Any
    profile: Any


@dataclass
class Farm:
    """A connection to a running farm (embedded or lab)."""

    store: RecordStore
    app: Any
    tracker: str | None
    check_alive: Callable[[], None]
    embedded: bool


def check_out_dir(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise UsageError("--out exists and is not a folder", subject=str(out))
    if out.exists() and any(out.iterdir()) and not force:
        raise UsageError("--out exists and is not empty", subject=str(out),
                         hint="choose another --out or pass --force to replace it")


def check_out_writable(out: Path, keep: list[Path]) -> None:
    """The results are staged beside --out and moved in at the end (`complete`): the folder
    that will hold --out, or the nearest one that exists (the rest is made then), must be a
    folder this process can write in, and --out (replaced at the end) must hold none of
    `keep` (the model, FARM_HOME). Checked now, not after hours of tuning."""
    target = out.resolve()
    for path in keep:
        if path.resolve() == target or target in path.resolve().parents:
            raise UsageError(f"--out would replace {path}", subject=str(out),
                             hint="choose a results folder of its own")
    parent = target.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"--out cannot be made: {parent} is a file, not a folder",
                         subject=str(out), hint="choose an --out under a folder")
    try:  # a real attempt: permission bits do not tell root, read-only mounts or /proc
        os.rmdir(tempfile.mkdtemp(prefix=f".{target.name or 'out'}.probe-", dir=parent))
    except OSError as e:
        raise UsageError(f"--out cannot be written: {parent}: {e.strerror or e}",
                         subject=str(out), hint="choose an --out in a folder you can write") from e


def check_tracker(addr: str, device_key: str, wait_s: float) -> None:
    """--tracker (where the compiled model runs, on a phone of the key) is HOST:PORT, a TVM RPC
    tracker answers there, and (unless waiting for devices) it has a phone of the key: found
    now, not at the compile step after the whole tuning."""
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError("--tracker must be HOST:PORT", subject=f"tracker {addr}",
                         hint="e.g. --tracker 192.168.1.10:9190 (the worker host's tracker)")
    from farm import tracker

    before = socket.getdefaulttimeout()
    socket.setdefaulttimeout(10.0)  # TVM's tracker client waits forever on a silent peer
    try:
        found = tracker.phones(addr)  # a ServiceError naming the tracker when none answers
    finally:
        socket.setdefaulttimeout(before)
    have = found.get(device_key)
    if wait_s == 0 and (have is None or have.total == 0):
        raise ServiceError(f"no phone of key {device_key!r} is registered at this tracker "
                           f"(keys there: {', '.join(sorted(found)) or 'none'})",
                           subject=f"tracker {addr}",
                           hint="the compiled model runs on a phone of the key there: pass the "
                                "tracker of a worker host with such phones, or "
                                "--wait-for-devices SECONDS")


def preflight(opts: SubmitOptions, config: FarmConfig,
              report: Callable[[str], None]) -> None:
    """Every check bad input can fail, before a service starts or a byte is written: the
    flags, the model file (never unpickled here), --out, the device key, --tracker, and a lab
    farm's store and phones. Cheap checks first; TVM is imported only for a --tracker."""
    check_options(opts)
    shapes = ingest_stage.parse_shapes(opts.input_shape)
    ingest_stage.check_inputs(shapes, opts.dtype)
    check_out_dir(opts.out, opts.force)
    check_out_writable(opts.out, [opts.model, Path(config.home)])
    ingest_stage.check_model(opts.model, shapes, opts.allow_pickle)
    lab = bool(config.broker_url)
    # the embedded farm emulates phones of any key it is told, so a mistyped key would tune
    # for this CPU: refused. A lab farm's hosts say which keys exist (checked below).
    profile = resolve_profile(config.device_key, config.profiles, strict=not lab)
    if not lab:
        check_embedded(profile)
        if not opts.wait:
            raise UsageError("--no-wait needs a farm that goes on without this command; the "
                             "embedded farm stops with it", subject="--no-wait",
                             hint="set FARM_BROKER_URL to a lab farm (`farm up` starts one), "
                                  "or drop --no-wait")
        if opts.tracker:
            raise UsageError("--tracker is for a lab farm; the embedded farm runs the compiled "
                             "model on its own emulated phones", subject=f"tracker {opts.tracker}",
                             hint="drop --tracker, or set FARM_BROKER_URL")
        return
    if opts.tracker:
        check_tracker(opts.tracker, profile.key, opts.wait_for_devices_s)
    store = open_store(config.store_url)
    try:
        store.ping()
        if opts.wait_for_devices_s == 0:
            wait_for_devices(store, profile.key, 0)
    finally:
        store.close()
    if profile.key not in known_keys(config.profiles):
        report(f"device key {profile.key} has no profile here: tuning for target "
               f"{canonical_target(profile.target)} (describe the device in farm.toml as "
               f"[profiles.{profile.key}] if that is not what it is)")


@contextlib.contextmanager
def connect(config: FarmConfig, tracker: str | None = None, wait_s: float = 0.0,
            require_devices: bool = True) -> Iterator[Farm]:
    """The farm to submit to: the lab farm at config.broker_url, or an embedded one."""
    if config.broker_url:
        store = open_store(config.store_url)
        store.ping()
        if require_devices:
            wait_for_devices(store, config.device_key, wait_s)
        yield Farm(store=store, app=make_app(config), tracker=tracker,
                   check_alive=lambda: None, embedded=False)
        store.close()
        return
    from farm.embedded import embedded_farm

    profile = resolve_profile(config.device_key, config.profiles)
    check_embedded(profile)
    with embedded_farm(config, threads=profile.threads, arch=profile.emulate) as farm:
        cfg = replace(config, broker_url=farm.broker_url)
        store = open_store(farm.broker_url)
        store.ping()
        try:
            yield Farm(store=store, app=make_app(cfg), tracker=farm.tracker,
                       check_alive=farm.group.check_alive, embedded=True)
        finally:
            store.close()


def check_embedded(profile: Any) -> None:
    """Refuse, with the reason, a profile the embedded farm's emulated phones cannot run."""
    import platform

    if profile.target.get("kind") != "llvm":
        raise UsageError(f"the embedded farm's phones are CPUs; profile {profile.key} targets "
                         f"{profile.target.get('kind')} (the PyPI TVM build has no OpenCL or "
                         f"GPU runtime)", subject=f"device key {profile.key}",
                         hint="submit to a lab farm whose phones run a TVM RPC app built with "
                              "it (FARM_BROKER_URL)")
    triple = str(profile.target.get("mtriple", ""))
    emulated = {"arm64": "aarch64"}.get(profile.emulate, platform.machine())
    if triple and not triple.startswith(emulated):
        raise UsageError(f"the embedded farm emulates phones of this {emulated} CPU, "
                         f"but profile {profile.key} targets {triple}",
                         subject=f"device key {profile.key}",
                         hint="submit to a lab farm with phones of that key (FARM_BROKER_URL), "
                              "or use --device-key arm64-sim for an emulated arm64 phone")


def wait_for_devices(store: RecordStore, device_key: str, wait_s: float) -> None:
    """Fail fast (or wait `wait_s`) when no worker host has phones of `device_key`."""
    from farm import hosts

    deadline = time.monotonic() + wait_s
    while True:
        found = hosts.list_hosts(store.r)  # type: ignore[attr-defined]
        if any(h.phones.get(device_key, {}).get("total", 0) > 0 for h in found):
            return
        if time.monotonic() >= deadline:
            have = sorted({k for h in found for k in h.phones}) or ["none"]
            raise ServiceError(f"no worker host has phones of key {device_key!r} "
                               f"(keys on the farm: {', '.join(have)})",
                               subject=f"device key {device_key}",
                               hint="start a worker whose tracker has such phones, or pass "
                                    "--wait-for-devices SECONDS")
        time.sleep(2)


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def prepare(opts: SubmitOptions, config: FarmConfig,
            report: Callable[[str], None]) -> Prepared:
    """Stages 1 (ingest, torch) and 2 (extract, TVM). For a lab farm before the farm is
    contacted; for the embedded one while its worker warms up (see `submit`)."""
    profile = resolve_profile(config.device_key, config.profiles).on_cpu(
        opts.target_cpu if opts.target_cpu is not None else target_cpu(config, report))
    bundle = ingest_stage.load(opts.model, ingest_stage.parse_shapes(opts.input_shape),
                               opts.dtype, opts.allow_pickle, threads=profile.threads)
    report(f"ingest: {opts.model} ({bundle.fmt}), inputs "
           f"{[list(x.shape) for x in bundle.inputs]}, torch {bundle.torch_us:.0f} us")
    extracted = extract_stage.extract(bundle.mod, profile, bundle.name)
    report(f"extract: {len(extracted.tasks)} tuning tasks for device key {profile.key}")
    return Prepared(bundle=bundle, extracted=extracted, profile=profile)


def target_cpu(config: FarmConfig, report: Callable[[str], None]) -> str:
    """The CPU a `host_cpu` profile (cpu-local) is tuned for: this machine's for the embedded
    farm; on a lab farm, the CPU the hosts with phones of the key report in their heartbeats
    (this machine's when none does)."""
    from farm.hostcpu import cpu_for_key, system_cpu

    if not config.broker_url:
        return system_cpu()
    from farm import hosts

    store = open_store(config.store_url)
    try:
        found = cpu_for_key(hosts.list_hosts(store.r), config.device_key)  # type: ignore[attr-defined]
    finally:
        store.close()
    if found is None:
        report(f"no worker host reports its CPU for key {config.device_key}: tuning for this "
               f"machine's ({system_cpu() or 'generic'})")
        return system_cpu()
    return found


def check_same_tasks(job: JobSpec, prep: Prepared, model: Path) -> None:
    """A job taken up again must be the same model: the same tuning tasks, in order."""
    if [t.workload_key for t in prep.extracted.tasks] != job.workload_keys:
        raise UsageError(f"{model} no longer gives the job's tuning tasks (was it changed?)",
                         subject=f"job {job.job_id}", hint="submit it as a new job")


def check_options(opts: SubmitOptions) -> None:
    """The job's numbers: whole trials, finite seconds, each in range."""
    for flag, value, least, example in (
            ("--trials-per-task", opts.trials_per_task, 1, "e.g. --trials-per-task 32"),
            ("--trials", opts.trials_budget, 0, "e.g. --trials 500, or leave it out"),
            ("--early-stop", opts.early_stop_rounds, 0, "e.g. --early-stop 3, or leave it out")):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise UsageError(f"must be a whole number >= {least}, got {value!r}", subject=flag,
                             hint=example)
    for flag, secs, positive in (("--timeout", opts.timeout_s, True),
                                 ("--wait-for-devices", opts.wait_for_devices_s, False)):
        if secs is not None and (not math.isfinite(secs) or secs < 0 or positive and secs == 0):
            raise UsageError(f"must be a finite number of seconds {'> 0' if positive else '>= 0'}"
                             f", got {secs!r}", subject=flag,
                             hint=f"e.g. {flag} 3600, or leave it out")
    if opts.priority not in PRIORITIES:
        raise UsageError(f"--priority must be one of {', '.join(PRIORITIES)}, "
                         f"got {opts.priority!r}")


def submit(opts: SubmitOptions, config: FarmConfig, report: Callable[[str], None] = print,
           resume: str | None = None) -> dict[str, Any]:
    """Run a job end to end (or, with `resume`, the rest of an earlier job); return the
    summary (also written to <out>/summary.json)."""
    t0 = time.monotonic()
    preflight(opts, config, report)  # bad input fails here: nothing started, nothing written
    # a lab farm: read the model before dispatching. The embedded farm starts first, so
    # that its worker warms up (TVM's tensor intrinsics: ~30 s) while the model is read.
    prep = prepare(opts, config, report) if config.broker_url else None
    with connect(config, opts.tracker, opts.wait_for_devices_s) as farm:
        if prep is None:
            prep = prepare(opts, config, report)
        job = dispatch_job(farm, opts, config, prep, report, resume)
        if not opts.wait:  # a lab farm (preflight refuses --no-wait on an embedded one)
            return {"job_id": job.job_id, "state": "submitted"}
        try:
            return complete(farm, job, prep, opts, config, report, t0)
        except BaseException:
            if farm.embedded:  # nobody else will finish this job: its queued rounds must
                # not run in the next embedded farm (its records stay in the store)
                with contextlib.suppress(Exception):
                    farm.store.set_job_status(job.job_id, state="cancelled",
                                              message="the submitting farm stopped")
            raise


def dispatch_job(farm: Farm, opts: SubmitOptions, config: FarmConfig, prep: Prepared,
                 report: Callable[[str], None], resume: str | None = None) -> JobSpec:
    """Stages 3 (plan: the store says what is already tuned) and 4 (dispatch: one message per
    task's first round; further rounds chain on the workers). With `resume`, the job keeps its
    id and starts its next run: rounds of an earlier run are stale and skipped."""
    tasks, profile = prep.extracted.tasks, prep.profile
    job_id, run = new_job_id(), 0
    if resume is not None:
        old = farm.store.require_job(resume)
        check_same_tasks(old, prep, opts.model)
        job_id, run = resume, old.run + 1
        farm.store.reset_job(job_id)
    plans = plan_stage.plan(tasks, farm.store, opts.trials_per_task, config.round_trials)
    budget = 0
    if opts.trials_budget:
        have = sum(min(p.in_store, opts.trials_per_task) for p in plans)
        budget = max(0, opts.trials_budget - have)
        if budget == 0:  # the store already holds the whole budget
            plans = [plan_stage.TaskPlan(p.task, p.in_store, 0, 0) for p in plans]
        else:
            plans = [plan_stage.TaskPlan(p.task, p.in_store, min(p.needed, budget),
                                         budget + 2) if not p.cached else p
                     for p in plans]
    todo = [p for p in plans if not p.cached]
    first_round = config.round_trials if not budget else max(
        1, min(config.round_trials, budget // max(1, len(todo))))
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
    for p in plans:
        farm.store.put_workload(p.task, job_id)
        if p.cached:
            farm.store.set_task_state(job_id, p.task.workload_key, TaskState(
                state="done", message=f"from store ({p.in_store} trials)",
                updated_at=time.time()))
            continue
        trials = min(first_round, p.needed)
        if budget:
            trials = farm.store.allocate(job_id, trials, budget)
            if trials == 0:
                farm.store.set_task_state(job_id, p.task.workload_key, TaskState(
                    state="done", message="job budget allocated to other tasks",
                    updated_at=time.time()))
                continue
        first = RoundRequest(
            job_id=job_id, workload_key=p.task.workload_key, task_name=p.task.name,
            round_index=0, trials=trials, target_trials=opts.trials_per_task,
            max_rounds=p.max_rounds, device_key=profile.key, model=prep.bundle.name,
            run=run, priority=PRIORITIES[opts.priority])
        # the state names the round before it is sent: a lost send is the supervisor's to redo
        farm.store.set_task_state(job_id, p.task.workload_key, TaskState(
            state="queued", message="round 1 queued", updated_at=time.time(),
            round=first.to_json()))
        send_round(farm.app, first)
    planned = budget or sum(p.needed for p in plans)
    verb = f"resumed (run {run + 1})" if resume else "submitted"
    report(f"plan: job {job_id} {verb}: {planned} trials to measure, "
           f"{sum(1 for p in plans if p.cached)} of {len(plans)} tasks from the store")
    if not todo:  # nothing to tune: the job is finished now
        finalize_stage.finalize_job(farm.store, job, by=CLIENT)
    return job


def complete(farm: Farm, job: JobSpec, prep: Prepared, opts: SubmitOptions, config: FarmConfig,
             report: Callable[[str], None], t0: float) -> dict[str, Any]:
    """Stages 5-7 for a dispatched job: wait for the workers (the store is the truth, not a
    chord callback), finalize (once per job, whoever comes first), compile and check against
    torch, write <out>. Used by `farm submit`, `farm resume` and `farm wait`."""
    tasks = prep.extracted.tasks
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{opts.out.name}.partial-", dir=opts.out.parent))
    try:
        t_tune = time.monotonic()
        wait_for_job(farm, job, report, opts.timeout_s, live=opts.live)
        tuning_s = time.monotonic() - t_tune
        # 6. finalize: the job's best record per workload (fixed once) -> one JSONDatabase.
        picks = finalize_stage.finalize_job(farm.store, job, by=CLIENT)
        bests = finalize_stage.write_best_log(farm.store, tasks, staging / "best", picks)
        states = farm.store.task_states(job.job_id)
        measured = farm.store.job_measured(job.job_id)
        from_store = {t.workload_key: max(0, farm.store.record_count(t.workload_key)
                                          - measured.get(t.workload_key, 0)) for t in tasks}
        # 7. compile, check against torch, benchmark on a phone of the key.
        report("compile: building tuned and untuned models, checking against torch")
        result = compile_stage.compile_and_check(
            prep.extracted.fused, prep.profile.target_json(), staging / "best", staging,
            prep.bundle.inputs, prep.bundle.outputs, farm.tracker, prep.profile.key,
            {t.workload_key: t.name for t in tasks},
            {t.name for t in tasks if bests.get(t.workload_key) is not None},
            prep.extracted.untunable, fcompile=cross.fcompile(prep.profile),
        )
        summary = make_summary(job, prep.bundle, tasks, from_store, states, measured, bests,
                               result, prep.profile, time.monotonic() - t0,
                               farm.store.job_counts(job.job_id))
        summary["tuning_s"] = round(tuning_s, 1)
        summary["out"] = str(opts.out)
        report_stage.write(staging, summary, farm.store)
        (staging / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=False))
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


def follow(job_id: str, config: FarmConfig, report: Callable[[str], None],
           out: Path | None = None, force: bool = False,
           timeout_s: float | None = None) -> dict[str, Any]:
    """`farm wait JOB`: the client's part of a lab job whose submitting client died or did not
    wait. Waits for it (the farm's supervisor re-sends lost rounds and finalizes it; finalize
    here too, once per job, is a no-op then), and when its model file is readable here,
    compiles it into <out> (default: the job's own --out) like `farm submit` would."""
    t0 = time.monotonic()
    if not config.broker_url:
        raise UsageError("`farm wait` follows a job on a lab farm; an embedded farm stops with "
                         "its `farm submit`", subject=f"job {job_id}",
                         hint=f"`farm resume {job_id}` continues it on a new embedded farm")
    with connect(config, require_devices=False) as farm:
        job = farm.store.require_job(job_id)
        opts = SubmitOptions.from_job(job, out=out, force=force, timeout_s=timeout_s)
        farm.tracker = opts.tracker
        if opts.model.is_file():
            check_out_dir(opts.out, opts.force)
            check_out_writable(opts.out, [opts.model, Path(config.home)])
            prep = prepare(opts, replace(config, device_key=job.device_key), report)
            check_same_tasks(job, prep, opts.model)
            return complete(farm, job, prep, opts, config, report, t0)
        wait_for_job(farm, job, report, timeout_s)
        picks = finalize_stage.finalize_job(farm.store, job, by=CLIENT)
        report(f"job {job_id}: finalized ({len(picks)} of {len(job.workload_keys)} tasks have a "
               f"best record); {opts.model} is not readable here, so it was not compiled")
        return {"job_id": job_id, "state": "finalized", "best_records": len(picks)}


def wait_for_job(farm: Farm, job: JobSpec, report: Callable[[str], None],
                 timeout_s: float | None, poll_s: float = 1.0,
                 live: bool = False) -> dict[str, TaskState]:
    """Poll the store until every task of the job is done, exhausted or failed. Only waits
    and reads: the farm's supervisor (workers/supervisor.py) re-sends lost rounds and
    finalizes the job, client or no client. `live`: redraw the per-task view
    (farm/progress.py) on stderr instead of printing a line per change."""
    import sys

    import redis

    from farm.progress import job_view, render

    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    last = ""
    drawn = 0  # lines of the live view on screen
    outage_since: float | None = None
    while True:
        farm.check_alive()
        try:
            states = farm.store.task_states(job.job_id)
            measured = farm.store.job_measured(job.job_id)
            outage_since = None
        except redis.RedisError as e:  # Redis restarting: the job goes on, keep waiting
            now = time.monotonic()
            outage_since = outage_since or now
            if now - outage_since > STORE_OUTAGE_S:
                raise ServiceError(f"the store has been unreachable for {STORE_OUTAGE_S:.0f} s: "
                                   f"{e}", subject=f"job {job.job_id}",
                                   hint=f"the job goes on; `farm wait {job.job_id}` later") from e
            report(f"job {job.job_id}: store unreachable ({e}); retrying")
            time.sleep(2)
            continue
        line = progress_line(job, states, measured)
        if live:
            text = render(job_view(farm.store, job))
            sys.stderr.write((f"\x1b[{drawn}A\x1b[J" if drawn else "") + text + "\n")
            sys.stderr.flush()
            drawn = text.count("\n") + 1
        elif line != last:
            report(line)
            last = line
        if len(states) >= len(job.workload_keys) and all(
                states[wk].terminal for wk in job.workload_keys if wk in states):
            failed = {wk: s for wk, s in states.items() if s.state == "failed"}
            if failed and len(failed) == len(job.workload_keys):
                first = next(iter(failed.values()))
                raise TuneError(f"every task failed; first: {first.message}",
                                subject=f"job {job.job_id}")
            return states
        if deadline is not None and time.monotonic() > deadline:
            raise TuneError(f"not finished after {timeout_s:.0f} s ({line})",
                            subject=f"job {job.job_id}",
                            hint=f"the job goes on; check it with `farm status {job.job_id}`")
        time.sleep(poll_s)


def progress_line(job: JobSpec, states: dict[str, TaskState], measured: dict[str, int]) -> str:
    counts: dict[str, int] = {}
    for s in states.values():
        counts[s.state] = counts.get(s.state, 0) + 1
    done = sum(counts.get(k, 0) for k in ("done", "exhausted", "failed"))
    parts = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    waiting = [s.message for s in states.values() if s.state == "waiting"]
    extra = f"; {waiting[0]}" if waiting else ""
    return (f"job {job.job_id}: {done}/{len(job.workload_keys)} tasks finished ({parts}), "
            f"{sum(measured.values())} trials measured{extra}")


def make_summary(job: JobSpec, bundle: Any, tasks: list[Any], from_store: dict[str, int],
                 states: dict[str, TaskState], measured: dict[str, int], bests: dict[str, Any],
                 result: compile_stage.CompileResult, profile: Any, wall_s: float,
                 counts: dict[str, dict[str, int]] | None = None) -> dict[str, Any]:
    counts = counts or {}
    rows = []
    for task in tasks:
        wk = task.workload_key
        st = states.get(wk, TaskState())
        best = bests.get(wk)
        rows.append({
            "name": task.name, "workload_key": wk, "weight": task.weight,
            "trials_measured": measured.get(wk, 0), "trials_from_store": from_store.get(wk, 0),
            "best_us": round(best.run_us, 3) if best is not None else None,
            "failed": sum(st.failures.values()), "failures": st.failures,
            "device_lost": st.device_lost, "retries": st.retries, "rounds": st.rounds,
            "measure_s": round(st.measure_s, 2),
            "single_schedule": st.single_schedule,
            "counts": counts.get(wk, dict.fromkeys(MEASURE_COUNTERS, 0)),
            "state": st.state,
            "message": st.message,
        })
    return {
        "job_id": job.job_id, "model": bundle.path, "format": bundle.fmt,
        "device_key": job.device_key, "target": job.target,
        "trials_per_task": job.trials_per_task,
        "inputs": [list(x.shape) for x in bundle.inputs],
        "priority": job.priority, "run": job.run,
        "tasks": rows,
        # every run sent to a phone, counted by the store: duplicates is "measured twice"
        "measurements": total_counts(counts),
        "latency_us": {"torch": round(bundle.torch_us, 2), "untuned": round(result.untuned_us, 2),
                       "tuned": round(result.tuned_us, 2)},
        "speedup": {"tuned_vs_untuned": round(result.untuned_us / result.tuned_us, 3),
                    "tuned_vs_torch": round(bundle.torch_us / result.tuned_us, 3)},
        "threads": profile.threads, "measured_on": result.measured_on,
        "numerics_ok": result.numerics_ok, "max_abs_err": result.max_abs_err,
        "schedules": {"from_log": result.from_log, "fallback": result.fallback},
        "library": "model.so", "best_log": "best/",
        "wall_s": round(wall_s, 1),
    }


def format_table(summary: dict[str, Any]) -> str:
    rows = [("task", "trials", "from store", "best us", "state")]
    for t in summary["tasks"]:
        best = f"{t['best_us']:.1f}" if t["best_us"] is not None else "-"
        rows.append((t["name"][:48], str(t["trials_measured"]), str(t["trials_from_store"]),
                     best, t["state"]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lat = summary["latency_us"]
    lines.append("")
    foreign = "target" in summary and "mtriple" in summary["target"]
    torch_where = " (torch on this machine's CPU: not comparable)" if foreign else ""
    lines.append(f"latency (us, {summary['threads']} thread(s), {summary['measured_on']}): "
                 f"torch {lat['torch']:.1f}  untuned {lat['untuned']:.1f}  tuned {lat['tuned']:.1f}"
                 f"{torch_where}")
    vs_torch = "" if foreign else f", {summary['speedup']['tuned_vs_torch']:.2f}x vs torch"
    lines.append(f"speed-up: {summary['speedup']['tuned_vs_untuned']:.2f}x vs untuned"
                 f"{vs_torch}; numerics "
                 f"{'match torch' if summary['numerics_ok'] else 'DO NOT match torch'} "
                 f"(max abs err {summary['max_abs_err']:.2e})")
    single = [t for t in summary["tasks"] if t.get("single_schedule")]
    if single:
        lines.append(f"{len(single)} task(s) have one possible schedule: measured once, "
                     "not searched")
    fb = summary["schedules"]["fallback"]
    if fb:
        lines.append(f"default schedule for {len(fb)} function(s): "
                     + "; ".join(f"{k} ({v})" for k, v in fb.items()))
    lines.append(f"wall time {summary['wall_s']:.0f} s, job {summary['job_id']}")
    return "\n".join(lines)

