"""The `farm` command: parses arguments and calls the library. Nothing else lives here.

Errors become one line on stderr and the exit code of their class (README:
"Exit codes"); `--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from farm.core.errors import EXIT_INTERRUPTED, FarmError, UsageError


def _config(args: argparse.Namespace, **flags: Any) -> Any:
    from farm.core.config import load_config

    return load_config(flags, config_file=getattr(args, "config", None))


def cmd_submit(args: argparse.Namespace) -> int:
    from farm.pipeline.job import SubmitOptions, submit

    config = _config(args, device_key=args.device_key, round_trials=args.round_trials,
                     phones=args.phones, broker_url=args.broker)
    if args.trials is not None and args.trials < 1:  # left out: no job budget (0 below)
        raise UsageError(f"must be a whole number >= 1, got {args.trials}", subject="--trials",
                         hint="e.g. --trials 500, or leave it out for no job budget")
    opts = SubmitOptions(
        model=Path(args.model), out=Path(args.out),
        trials_per_task=(args.trials_per_task if args.trials_per_task is not None
                         else (args.trials if args.trials else 32)),
        trials_budget=args.trials or 0, early_stop_rounds=args.early_stop or 0,
        input_shape=args.input_shape, dtype=args.dtype, allow_pickle=args.allow_pickle,
        force=args.force, wait=not args.no_wait, timeout_s=args.timeout, tracker=args.tracker,
        wait_for_devices_s=args.wait_for_devices or 0.0, priority=args.priority,
    )
    return _print_summary(submit(opts, config, report=_progress, view=_live_view()), opts.out)


def _live_view() -> Any:
    """The live per-task view on a terminal; None (a line per change) otherwise."""
    from farm.client.progress import LiveView

    return LiveView() if sys.stderr.isatty() else None


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _print_summary(summary: dict[str, Any], out: Path) -> int:
    from farm.client.progress import format_table

    if "tasks" not in summary:
        print(json.dumps(summary))
        return 0
    print(format_table(summary))
    print(f"results in {out}/ (summary.json, best/, model.so, report.html)")
    return 0 if summary["numerics_ok"] else 7


def cmd_resume(args: argparse.Namespace) -> int:
    """Continue a job from the records in the store: only what is missing is measured."""
    from farm.pipeline.job import SubmitOptions, submit

    with _store(args) as store:
        job = store.require_job(args.job)
    config = _config(args, broker_url=args.broker, device_key=job.device_key,
                     round_trials=job.round_trials)
    opts = SubmitOptions.from_job(job, out=Path(args.out) if args.out else None, force=True,
                                  timeout_s=args.timeout, wait=not args.no_wait)
    return _print_summary(submit(opts, config, report=_progress, resume=job.job_id,
                                 view=_live_view()), opts.out)


def cmd_worker(args: argparse.Namespace) -> int:
    from workers.main import run_worker  # the CLI is the one place that starts a worker

    config = _config(args, broker_url=args.broker, redis_url=args.redis,
                     worker_concurrency=args.concurrency)
    keys = [k for k in (args.keys or "").split(",") if k]
    return run_worker(config, args.tracker, keys or None, args.hostname, args.loglevel, args.pool)


def cmd_tracker(args: argparse.Namespace) -> int:
    import os

    os.execv(sys.executable, [sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", args.host,
                              "--port", str(args.port), "--port-end", str(args.port + 1)])
    return 0  # pragma: no cover


def cmd_phones(args: argparse.Namespace) -> int:
    from farm.local import services

    log_dir = Path(args.log_dir)
    group = services.ServiceGroup()
    try:
        home = Path(_config(args).home)
        from farm.devices.phone import advertised_address

        shown = (advertised_address(args.host, args.advertise, args.tracker)
                 or "the address they reach the tracker from")
        for i in range(args.count):
            group.add(services.start_phone(args.tracker, args.key, i, log_dir, args.threads,
                                           host=args.host, arch=args.arch, home=home,
                                           advertise=args.advertise))
        from farm.devices.tracker import wait_for_phones

        wait_for_phones(args.tracker, args.key, args.count, timeout_s=300 if args.arch else 60)
        print(f"{args.count} emulated phones of key {args.key} on tracker {args.tracker}, "
              f"listening on {args.host}, advertised as {shown} "
              f"(logs in {log_dir}); Ctrl-C stops them", file=sys.stderr)
        while True:
            group.check_alive()
            time.sleep(1)
    finally:
        group.stop()


@contextlib.contextmanager
def _store(args: argparse.Namespace) -> Iterator[Any]:
    """The lab farm's store, or the embedded farm's (its Redis started for this command)."""
    from farm.local.embedded import embedded_store_url
    from farm.store import open_store

    config = _config(args, broker_url=getattr(args, "broker", None))
    with contextlib.ExitStack() as stack:
        url = config.store_url or stack.enter_context(embedded_store_url(config))
        store = open_store(url)
        store.ping()
        stack.callback(store.close)
        yield store


def cmd_status(args: argparse.Namespace) -> int:
    with _store(args) as store:
        return _status(args, store)


def _status(args: argparse.Namespace, store: Any) -> int:
    from farm.client.progress import job_view, render

    job_ids = [args.job] if args.job else store.job_ids()[-10:]
    live = getattr(args, "watch", False)
    while True:
        views = [job_view(store, store.require_job(job_id)) for job_id in job_ids]
        if args.json:
            print(json.dumps(views, indent=2))
        else:
            text = "\n".join(render(v) for v in views) or "no jobs on this farm"
            if live and sys.stdout.isatty():
                sys.stdout.write("\x1b[H\x1b[J")  # redraw in place
            print(text, flush=True)
        if not live or all(v["status"].get("state") != "running"
                           or v["tasks_finished"] == len(v["tasks"]) for v in views):
            return 0
        time.sleep(args.interval)


def cmd_report(args: argparse.Namespace) -> int:
    from farm.core.errors import StoreError
    from farm.pipeline import report

    out = Path(args.out)
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError) as e:
        raise StoreError(f"no readable summary.json: {e}", subject=str(out),
                         hint="pass the --out folder of a finished job") from e
    with _store(args) as store:
        path = report.write(out, summary, store)
    print(f"wrote {path}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from farm.client.doctor import run_checks

    config = _config(args, broker_url=args.broker)
    checks = run_checks(config, args.tracker, args.device_key or config.device_key)
    for c in checks:
        mark = "pass" if c.ok else "FAIL"
        print(f"[{mark}] {c.name}: {c.detail}" + ("" if c.ok else f"\n       fix: {c.fix}"))
    return 0 if all(c.ok for c in checks) else 5


def cmd_cancel(args: argparse.Namespace) -> int:

    with _store(args) as store:
        store.require_job(args.job)
        store.set_job_status(args.job, state="cancelled", cancelled_at=str(time.time()))
    print(f"job {args.job}: cancelled; rounds not yet started will not run")
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    from farm.pipeline.job import follow

    config = _config(args, broker_url=args.broker)
    out = Path(args.out) if args.out else None
    summary = follow(args.job, config, _progress, out=out, force=args.force,
                     timeout_s=args.timeout)
    return _print_summary(summary, out or Path(summary.get("out", ".")))


def cmd_cache(args: argparse.Namespace) -> int:
    if args.action == "verify":
        return _cache_verify(args)
    if args.action == "import":  # a wrong folder is refused before the store is opened
        from farm.client.cache import check_log_dir

        if not args.arg:
            raise UsageError("farm cache import needs a JSONDatabase folder")
        check_log_dir(Path(args.arg))
    with _store(args) as store:
        return _cache(args, store)


def _cache_verify(args: argparse.Namespace) -> int:
    """Measure the stored bests again on a phone of the key and print the drift."""
    from farm.core.profiles import resolve_profile
    from farm.pipeline.job import target_cpu
    from farm.store import open_store
    from workers.verify import DRIFT_WARN, verify_bests

    config = _config(args, broker_url=args.broker, device_key=args.device_key)
    profile = resolve_profile(config.device_key, config.profiles).on_cpu(
        target_cpu(config, _progress))
    wks = args.arg.split(",") if args.arg else None
    if config.store_url:
        if not args.tracker:
            raise UsageError("verifying a lab farm's store needs a tracker with phones of the "
                             "key", subject="farm cache verify",
                             hint="pass --tracker HOST:PORT of a worker host")
        with _store(args) as store:
            rows = verify_bests(store, args.tracker, profile, config, wks)
    else:
        from farm.local.embedded import embedded_farm

        with embedded_farm(config) as farm:
            store = open_store(farm.broker_url)
            try:
                rows = verify_bests(store, args.tracker or farm.tracker, profile, config, wks)
            finally:
                store.close()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'workload key':26} {'stored us':>10} {'now us':>10} {'drift':>8}  task")
    for r in rows:
        now = f"{r['measured_us']:.1f}" if r["measured_us"] is not None else "-"
        drift = f"{r['drift']:+.0%}" if r["drift"] is not None else "-"
        flag = "  << drift" if r["flagged"] else (f"  error: {r['error']}" if r["error"] else "")
        print(f"{r['workload_key']:26} {r['stored_us']:10.1f} {now:>10} {drift:>8}  "
              f"{r['name']}{flag}")
    flagged = sum(1 for r in rows if r["flagged"])
    print(f"{len(rows)} bests measured again on {profile.key}; {flagged} drifted more than "
          f"{DRIFT_WARN:.0%}")
    return 0


def _cache(args: argparse.Namespace, store: Any) -> int:
    from farm.client import cache
    from farm.core.profiles import resolve_profile

    if args.action == "ls":
        rows = cache.entries(store, args.device_key)
        if args.json:
            print(json.dumps(rows, indent=2))
            return 0
        print(f"{'workload key':26} {'device key':14} {'trials':>6} {'unverified':>10} "
              f"{'best us':>10}  task")
        for r in rows:
            best = f"{r['best_us']:.1f}" if r["best_us"] is not None else "-"
            print(f"{r['workload_key']:26} {r['device_key']:14} {r['trials']:6} "
                  f"{r['unverified']:10} {best:>10}  {r['name']}")
    elif args.action == "show":
        if not args.arg:
            raise UsageError("farm cache show needs a workload key")
        print(json.dumps(cache.show(store, args.arg), indent=2))
    elif args.action == "stats":
        print(json.dumps(cache.stats(store), indent=2))
    elif args.action == "export":
        if not args.arg:
            raise UsageError("farm cache export needs a folder")
        n = cache.export(store, Path(args.arg), args.device_key)
        print(f"exported the best record of {n} workloads to {args.arg}/ (MetaSchedule JSONDatabase)")
    elif args.action == "import":
        if not args.arg:
            raise UsageError("farm cache import needs a JSONDatabase folder")
        from dataclasses import replace

        from farm.pipeline.job import target_cpu

        config = _config(args, broker_url=getattr(args, "broker", None))
        key = args.device_key or config.device_key
        profile = resolve_profile(key, config.profiles).on_cpu(
            target_cpu(replace(config, device_key=key), _progress))
        got = cache.import_log(store, Path(args.arg), profile, retarget=args.retarget)
        print(f"imported {got.new} new records of {got.workloads} workloads for device key "
              f"{key} ({got.known} already stored); unverified until a phone of the farm "
              f"measures them (the next job's first rounds measure the best of them)")
        for line in got.lines():
            print(line)
        if got.refused and not got.new and not got.known:
            raise UsageError(f"every record was refused ({sum(got.refused.values())})",
                             subject=args.arg, hint="see the reasons above")
    elif args.action == "rm":
        if not args.arg and not args.source:
            raise UsageError("farm cache rm needs workload keys or --source",
                             hint="`farm cache ls` lists workload keys; --source takes a job "
                                  "id, a host or an import path")
        wks = args.arg.split(",") if args.arg else []
        unknown = [wk for wk in wks if store.get_workload(wk) is None]
        if unknown:
            raise UsageError(f"no such workload: {', '.join(unknown)}", subject="farm cache rm",
                             hint="`farm cache ls` lists them")
        gone = cache.remove(store, wks, args.source)
        print(f"removed {gone['workloads']} workloads and {gone['records']} records"
              + (f" from {args.source}" if args.source else ""))
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    """A whole lab farm as local processes in the foreground: Redis (AOF), Flower, a tracker,
    emulated phones and a worker. Ctrl-C stops them all."""

    from farm.core.secrets import secret
    from farm.devices.tracker import wait_for_phones
    from farm.local import services

    args.redis_password = args.redis_password or secret("FARM_REDIS_PASSWORD")
    args.flower_auth = args.flower_auth or secret("FARM_FLOWER_AUTH")
    if not services.is_loopback(args.bind):
        missing = [what for what, value in (("FARM_REDIS_PASSWORD", args.redis_password),
                                            ("FARM_FLOWER_AUTH", args.flower_auth)) if not value]
        if missing:
            raise UsageError(f"binding {args.bind} (not loopback) needs {' and '.join(missing)}",
                             subject="farm up --bind",
                             hint="anyone who reaches an open Redis can forge records and run "
                                  "rounds; set them in the environment (not on the command "
                                  "line), or bind 127.0.0.1")
    config = _config(args)
    home = Path(config.home)
    log_dir = home / "up-logs"
    group = services.ServiceGroup(pid_file=None)
    try:
        redis_svc, url = services.start_redis(home / "up-redis", log_dir, port=args.redis_port,
                                              host=args.bind, password=args.redis_password,
                                              maxmemory=config.redis_maxmemory)
        group.add(redis_svc)
        argv, env = flower_command(url, args.bind, args.flower_port, args.flower_auth)
        group.add(services.start("flower", argv, log_dir, env))
        tracker_svc, tracker = services.start_tracker(log_dir, port=args.tracker_port)
        group.add(tracker_svc)
        for i in range(args.phones):
            group.add(services.start_phone(tracker, args.key, i, log_dir))
        wait_for_phones(tracker, args.key, args.phones, timeout_s=60)
        group.add(services.start_worker(tracker, url, log_dir))
        shown = url.replace(f":{args.redis_password}@", ":***@") if args.redis_password else url
        print(f"farm up: broker {shown}, flower http://{args.bind}:{args.flower_port}, "
              f"tracker {tracker}, {args.phones} phones of key {args.key}, logs in {log_dir}\n"
              f"submit with: FARM_BROKER_URL={shown} farm submit MODEL --out DIR "
              f"--tracker {tracker}\nCtrl-C stops everything.", file=sys.stderr, flush=True)
        while True:
            group.check_alive()
            time.sleep(1)
    finally:
        group.stop()


def flower_command(broker_url: str, address: str, port: int,
                   auth: str | None) -> tuple[list[str], dict[str, str]]:
    """Flower's command line and the environment that carries its secrets (the broker URL
    with its password, the basic-auth credentials): never on the command line, which every
    user of the host sees in `ps`. The result backend too: Flower then shows a running
    round's PROGRESS state."""
    argv = [sys.executable, "-m", "celery", "flower", f"--address={address}", f"--port={port}",
            "--persistent=False"]
    env = {"CELERY_BROKER_URL": broker_url, "CELERY_RESULT_BACKEND": broker_url}
    if auth:
        env["FLOWER_BASIC_AUTH"] = auth
    return argv, env


def cmd_flower(args: argparse.Namespace) -> int:
    """Flower on the farm's broker, loopback unless told otherwise, basic auth from
    $FARM_FLOWER_AUTH. Workers send task events (`-E`), so rounds show as they run."""
    import os

    config = _config(args, broker_url=args.broker)
    if not config.broker_url:
        raise UsageError("Flower watches a lab farm", hint="set FARM_BROKER_URL or pass --broker")
    from farm.core.secrets import secret
    from farm.local.services import is_loopback

    auth = args.auth or secret("FARM_FLOWER_AUTH")
    if auth is None and not is_loopback(args.address):
        raise UsageError(f"Flower on {args.address} without basic auth",
                         hint="set FARM_FLOWER_AUTH=user:password")
    argv, env = flower_command(config.broker_url, args.address, args.port, auth)
    os.execve(argv[0], argv, {**os.environ, **env})
    return 0  # pragma: no cover


def cmd_devices(args: argparse.Namespace) -> int:
    from farm.store import hosts

    with _store(args) as store:
        found = store.hosts()
        if args.json:
            print(json.dumps([h.to_json() for h in found], indent=2))
        else:
            print(hosts.format_hosts(found))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="farm", description="tunefarm: a distributed auto-tuning farm")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    p.add_argument("--config", help="farm.toml to read (default: $FARM_CONFIG or ./farm.toml)")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("submit", help="tune a model and compile it with the best configs")
    s.add_argument("model", help=".pt2 (torch.export), .pt (TorchScript) or a pickled nn.Module")
    s.add_argument("--out", required=True, help="results folder (must be new or empty)")
    s.add_argument("--trials-per-task", type=int,
                   help="trials per task (default 32; with --trials: a cap per task)")
    s.add_argument("--trials", type=int, metavar="N",
                   help="a job budget: every task gets a first round, further rounds go where "
                        "they pay most (weight x latency x recent gain)")
    s.add_argument("--early-stop", type=int, metavar="ROUNDS",
                   help="stop a task after ROUNDS rounds without improvement")
    s.add_argument("--input-shape", help="e.g. 1,3,224,224 (';' between inputs); needed for .pt")
    s.add_argument("--dtype", default="float32", help="input dtype (default float32)")
    s.add_argument("--allow-pickle", action="store_true",
                   help="load a pickled nn.Module (this runs code from the file)")
    s.add_argument("--device-key", help="device key to tune for (default cpu-local)")
    s.add_argument("--round-trials", type=int, help="trials per round (one Celery message)")
    s.add_argument("--phones", type=int, help="emulated phones of the embedded farm (default 2)")
    s.add_argument("--broker", help="submit to this lab farm (default: $FARM_BROKER_URL, "
                                    "else an embedded farm)")
    s.add_argument("--tracker", help="lab mode: run the compiled model on a phone of this tracker")
    s.add_argument("--force", action="store_true", help="replace a non-empty --out")
    s.add_argument("--no-wait", action="store_true", help="lab mode: return after submitting")
    s.add_argument("--timeout", type=float, help="give up waiting after this many seconds")
    s.add_argument("--wait-for-devices", type=float, metavar="SECONDS",
                   help="lab mode: wait this long for a host with phones of the key "
                        "(default: fail at once)")
    s.add_argument("--priority", default="normal", choices=["high", "normal", "low"],
                   help="queued rounds of a higher priority job run first (default normal; "
                        "jobs of one priority share the phones round by round)")
    s.set_defaults(func=cmd_submit)

    rs = sub.add_parser("resume", help="continue a job that stopped half-way (from the store)")
    rs.add_argument("job")
    rs.add_argument("--out", help="results folder (default: the job's own --out)")
    rs.add_argument("--timeout", type=float, help="give up waiting after this many seconds")
    rs.add_argument("--no-wait", action="store_true", help="lab mode: return after resuming")
    rs.add_argument("--broker")
    rs.set_defaults(func=cmd_resume)

    w = sub.add_parser("worker", help="run a worker host bound to one tracker")
    w.add_argument("--tracker", required=True, help="HOST:PORT of this host's TVM RPC tracker")
    w.add_argument("--broker", help="redis://[:PASSWORD@]HOST:6379/0 (default $FARM_BROKER_URL; "
                                    "prefer it: a flag shows in `ps`)")
    w.add_argument("--redis", help="record store URL (default: the broker)")
    w.add_argument("--keys", help="device keys to serve (default: every key on the tracker)")
    w.add_argument("--concurrency", type=int, help="rounds at once (default: 2 when the phones are devices of their own, 1 when they are emulated on this host)")
    w.add_argument("--hostname", help="Celery node name (default farm@<host>)")
    w.add_argument("--loglevel", default="INFO")
    w.add_argument("--pool", default="prefork", choices=["prefork", "solo"])
    w.set_defaults(func=cmd_worker)

    t = sub.add_parser("tracker", help="run a TVM RPC tracker (the phones register here)")
    t.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    t.add_argument("--port", type=int, default=9190)
    t.set_defaults(func=cmd_tracker)

    ph = sub.add_parser("phones", help="run emulated phones (local RPC servers) on a tracker")
    ph.add_argument("--count", type=int, default=2)
    ph.add_argument("--key", default="cpu-local")
    ph.add_argument("--tracker", default="127.0.0.1:9190")
    ph.add_argument("--threads", type=int, default=1)
    ph.add_argument("--host", default="127.0.0.1",
                    help="address the phones listen on (default loopback: only a worker on "
                         "this machine reaches them; 0.0.0.0 for every interface)")
    ph.add_argument("--advertise",
                    help="address the tracker gives workers to reach the phones (default "
                         "--host; with 0.0.0.0, the address they reached the tracker from)")
    ph.add_argument("--log-dir", default="phones-logs")
    ph.add_argument("--arch", default="", choices=["", "arm64"],
                    help="arm64: aarch64 TVM under qemu user mode (set up once in "
                         "$FARM_HOME/arm64-sim; needs qemu-user-static, debootstrap, "
                         "g++-aarch64-linux-gnu)")
    ph.set_defaults(func=cmd_phones)

    st = sub.add_parser("status", help="progress of jobs on a farm")
    st.add_argument("job", nargs="?")
    st.add_argument("--json", action="store_true")
    st.add_argument("--watch", action="store_true",
                    help="redraw until the jobs shown have finished")
    st.add_argument("--interval", type=float, default=2.0, help="seconds between redraws")
    st.add_argument("--broker")
    st.set_defaults(func=cmd_status)

    rp = sub.add_parser("report", help="rebuild <out>/report.html of a finished job")
    rp.add_argument("out", help="the job's --out folder")
    rp.add_argument("--broker")
    rp.set_defaults(func=cmd_report)

    dr = sub.add_parser("doctor", help="check tools, Redis, tracker, phones; print the fix for each")
    dr.add_argument("--device-key")
    dr.add_argument("--tracker", help="HOST:PORT to check phones and run a kernel on")
    dr.add_argument("--broker")
    dr.set_defaults(func=cmd_doctor)

    ca = sub.add_parser("cancel", help="cancel a job: its rounds not yet started do not run")
    ca.add_argument("job")
    ca.add_argument("--broker")
    ca.set_defaults(func=cmd_cancel)

    wt = sub.add_parser("wait", help="take over a lab job whose submitting client died: wait, "
                                     "finalize, compile")
    wt.add_argument("job")
    wt.add_argument("--out", help="results folder (default: the job's own --out)")
    wt.add_argument("--force", action="store_true", help="replace a non-empty --out")
    wt.add_argument("--timeout", type=float)
    wt.add_argument("--broker")
    wt.set_defaults(func=cmd_wait)

    c = sub.add_parser("cache", help="what the record store holds: ls, show KEY, stats, "
                                     "export DIR, import DIR, rm KEY[,KEY]|--source S, "
                                     "verify [KEY,KEY]")
    c.add_argument("action", choices=["ls", "show", "stats", "export", "import", "rm",
                                      "verify"])
    c.add_argument("arg", nargs="?", help="workload key (show; rm: comma-separated) or folder "
                                          "(export, import)")
    c.add_argument("--device-key", help="only this device key (import: the key to file under)")
    c.add_argument("--retarget", action="store_true",
                   help="import: file records tuned for another target under the profile's")
    c.add_argument("--source", help="rm: only the records from this job id, host or import "
                                    "path (all workloads, or the keys given)")
    c.add_argument("--tracker", help="verify: HOST:PORT of a tracker with phones of the key "
                                     "(default: the embedded farm's emulated phones)")
    c.add_argument("--json", action="store_true")
    c.add_argument("--broker")
    c.set_defaults(func=cmd_cache)

    u = sub.add_parser("up", help="a whole farm as local processes: redis, flower, tracker, "
                                  "phones, worker (foreground; Ctrl-C stops all)")
    u.add_argument("--bind", default="127.0.0.1", help="address Redis and Flower bind to")
    u.add_argument("--redis-port", type=int, default=6379)
    u.add_argument("--redis-password", default=None,
                   help="default: $FARM_REDIS_PASSWORD (prefer it: a flag shows in `ps`)")
    u.add_argument("--flower-port", type=int, default=5555)
    u.add_argument("--flower-auth", default=None,
                   help="user:password (default $FARM_FLOWER_AUTH; prefer it: a flag shows in "
                        "`ps`)")
    u.add_argument("--tracker-port", type=int, default=9190)
    u.add_argument("--phones", type=int, default=2)
    u.add_argument("--key", default="cpu-local")
    u.set_defaults(func=cmd_up)

    f = sub.add_parser("flower", help="Flower on the farm's broker (rounds, progress, workers)")
    f.add_argument("--address", default="127.0.0.1")
    f.add_argument("--port", type=int, default=5555)
    f.add_argument("--auth", help="user:password (default $FARM_FLOWER_AUTH; prefer it: a "
                                  "flag shows in `ps`)")
    f.add_argument("--broker")
    f.set_defaults(func=cmd_flower)

    d = sub.add_parser("devices", help="worker hosts, their trackers, device keys and phones")
    d.add_argument("--json", action="store_true")
    d.add_argument("--broker")
    d.set_defaults(func=cmd_devices)
    return p


def _one_line(e: FarmError) -> str:
    """The error as one line: an error quoting a multi-line message (TVM's) keeps its first
    line and its hint; `--debug` shows it all."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if len(lines) <= 1:
        return str(e)
    hint = f" ({e.hint})" if e.hint and not lines[0].endswith(f"({e.hint})") else ""
    return f"{lines[0]} [{len(lines) - 1} more lines with --debug]{hint}"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "worker":
        logging.getLogger().setLevel(logging.INFO)

    def on_term(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    try:
        return int(args.func(args) or 0)
    except FarmError as e:
        if args.debug:
            raise
        print(f"farm: error: {_one_line(e)}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("farm: interrupted; stopped everything this command started", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
