"""The `farm` command: parses arguments and calls the library. Nothing else lives here.

Errors become one line on stderr and the exit code of their class (README:
"Exit codes"); `--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from types import FrameType
from typing import TypeAlias

from farm.client.cmd_cache import cmd_cache
from farm.client.cmd_job import (
    cmd_cancel,
    cmd_report,
    cmd_resume,
    cmd_status,
    cmd_submit,
    cmd_wait,
)
from farm.client.cmd_lab import (
    cmd_devices,
    cmd_doctor,
    cmd_flower,
    cmd_phones,
    cmd_tracker,
    cmd_up,
    cmd_worker,
)
from farm.core.errors import EXIT_INTERRUPTED, FarmError
from farm.core.messages import PRIORITIES
from farm.pipeline.options import DEFAULT_DTYPE, DEFAULT_PRIORITY, DEFAULT_TRIALS

# what `add_subparsers` returns (argparse names its class privately)
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _versions() -> str:
    """tunefarm's version and the TVM its phones must run (read from the installed packages,
    without importing TVM: its phones' RPC servers must be built from this version)."""
    from importlib import metadata

    def of(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return (f"tunefarm {of('tunefarm')} (apache-tvm {of('apache-tvm')}, apache-tvm-ffi "
            f"{of('apache-tvm-ffi')}, celery {of('celery')}, torch {of('torch')})")


class _Version(argparse.Action):
    """--version: the line as it is (argparse's own action wraps it at the terminal width)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option: str | None = None) -> None:
        print(_versions())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="farm", description="tunefarm: a distributed auto-tuning farm")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    p.add_argument("--config", help="farm.toml to read (default: $FARM_CONFIG or ./farm.toml)")
    p.add_argument("--version", action=_Version, nargs=0, help="show the versions and exit")
    sub = p.add_subparsers(dest="command", required=True)

    _submit_command(sub)
    _job_commands(sub)
    _lab_commands(sub)
    _up_command(sub)
    _cache_commands(sub)
    return p


def _submit_command(sub: Commands) -> None:
    s = sub.add_parser("submit", help="tune a model and compile it with the best configs")
    s.add_argument("model", help=".pt2 (torch.export), .pt (TorchScript) or a pickled nn.Module")
    s.add_argument("--out", required=True, help="results folder (must be new or empty)")
    s.add_argument("--name", help="a name for the job, unique while it runs: `farm status "
                                  "NAME`, `farm wait NAME`, `Farm.job(NAME)` find it")
    s.add_argument("--trials-per-task", type=int,
                   help=f"trials per task (default {DEFAULT_TRIALS}; with --trials: a cap per "
                        "task, default none)")
    s.add_argument("--trials", type=int, metavar="N",
                   help="a job budget: every task gets a first round, further rounds go where "
                        "they pay most (weight x latency x recent gain)")
    s.add_argument("--early-stop", type=int, metavar="ROUNDS", default=0,
                   help="stop a task after ROUNDS rounds without improvement (default 0: never)")
    s.add_argument("--input-shape", help="e.g. 1,3,224,224 (';' between inputs); needed for .pt")
    s.add_argument("--dtype", default=DEFAULT_DTYPE,
                   help=f"input dtype (default {DEFAULT_DTYPE}); one per input with ';', "
                        "e.g. int64;float32")
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
    s.add_argument("--wait-for-devices", type=float, metavar="SECONDS", default=0.0,
                   help="lab mode: wait this long for a host with phones of the key "
                        "(default 0: fail at once)")
    s.add_argument("--priority", default=DEFAULT_PRIORITY, choices=list(PRIORITIES),
                   help=f"queued rounds of a higher priority job run first (default "
                        f"{DEFAULT_PRIORITY}; jobs of one priority share the phones round by "
                        "round)")
    _json_flag(s)
    s.set_defaults(func=cmd_submit)


def _json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true",
                   help="print the summary as JSON on stdout (without waiting: job_id and "
                        "out); progress goes to stderr")

def _job_commands(sub: Commands) -> None:
    rs = sub.add_parser("resume", help="continue a job that stopped half-way (from the store)")
    rs.add_argument("job")
    rs.add_argument("--out", help="results folder (default: the job's own --out)")
    rs.add_argument("--timeout", type=float, help="give up waiting after this many seconds")
    rs.add_argument("--no-wait", action="store_true", help="lab mode: return after resuming")
    rs.add_argument("--broker")
    rs.add_argument("--allow-pickle", action="store_true",
                    help="the model may be a pickle (it runs code): never taken from the store")
    _json_flag(rs)
    rs.set_defaults(func=cmd_resume)

    wt = sub.add_parser("wait", help="take over a lab job whose submitting client died: wait, "
                                     "finalize, compile")
    wt.add_argument("job")
    wt.add_argument("--out", help="results folder (default: the job's own --out)")
    wt.add_argument("--force", action="store_true", help="replace a non-empty --out")
    wt.add_argument("--timeout", type=float)
    wt.add_argument("--broker")
    wt.add_argument("--allow-pickle", action="store_true",
                    help="the model may be a pickle (it runs code): never taken from the store")
    _json_flag(wt)
    wt.set_defaults(func=cmd_wait)

    st = sub.add_parser("status", help="progress of jobs on a farm")
    st.add_argument("job", nargs="?")
    st.add_argument("--json", action="store_true")
    st.add_argument("--watch", action="store_true",
                    help="redraw until the jobs shown have finished")
    st.add_argument("--interval", type=float, default=2.0, help="seconds between redraws")
    st.add_argument("--broker")
    st.set_defaults(func=cmd_status)

    ca = sub.add_parser("cancel", help="cancel a job: its rounds not yet started do not run")
    ca.add_argument("job")
    ca.add_argument("--broker")
    ca.set_defaults(func=cmd_cancel)

    rp = sub.add_parser("report", help="rebuild <out>/report.html of a finished job")
    rp.add_argument("out", help="the job's --out folder")
    rp.add_argument("--against", metavar="OUT2",
                    help="another run's --out folder: the two runs side by side in the report")
    rp.add_argument("--broker")
    rp.set_defaults(func=cmd_report)


def _worker_command(sub: Commands) -> None:
    w = sub.add_parser("worker", help="run a worker host bound to one tracker")
    w.add_argument("--tracker", help="HOST:PORT of this host's TVM RPC tracker (required "
                                     "unless --helper)")
    w.add_argument("--helper", action="store_true",
                   help="a helper host: no tracker, no phones; it searches and builds rounds "
                        "for phone hosts short of cores (their phones measure)")
    w.add_argument("--lend-search", "--borrow-search", dest="lend_search",
                   choices=["auto", "always", "never"],
                   help="lend rounds' search and builds to helper hosts: auto (when this host "
                        "is short of cores for its phones; default), always, never "
                        "($FARM_LEND_SEARCH; --borrow-search and FARM_BORROW_SEARCH: its "
                        "name before)")
    w.add_argument("--broker", help="redis://[:PASSWORD@]HOST:6379/0 (default $FARM_BROKER_URL; "
                                    "prefer it: a flag shows in `ps`)")
    w.add_argument("--redis", help="record store URL (default: the broker)")
    w.add_argument("--keys", help="device keys to serve (default: every key on the tracker)")
    w.add_argument("--concurrency", type=int, help="rounds at once, fixed (default: automatic, from the measured speeds of the phones and of this host; see the README)")
    w.add_argument("--hostname", help="Celery node name, unique in the farm (default "
                                      "farm@<host>-<an id of this start>)")
    w.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port "
                   "(default $FARM_METRICS_PORT, else none)")
    w.add_argument("--metrics-host", help="address of /metrics (default 127.0.0.1)")
    w.add_argument("--loglevel", default="INFO")
    w.add_argument("--pool", default="prefork", choices=["prefork", "solo"])
    w.set_defaults(func=cmd_worker)


def _lab_commands(sub: Commands) -> None:
    _worker_command(sub)

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
                    help="arm64: a native aarch64 RPC server on TVM's runtime, under qemu user "
                         "mode (made once in $FARM_HOME/arm64-sim; needs qemu-user-static, "
                         "g++-aarch64-linux-gnu)")
    ph.add_argument("--opencl", action="store_true",
                    help="the phones have an OpenCL device: TVM's OpenCL runtime, built once "
                         "from $TVM_SOURCE (a TVM checkout at the pinned version) into "
                         "$FARM_HOME/opencl; this machine's OpenCL platform (pocl's CPU "
                         "device where there is no GPU; needs opencl-headers, "
                         "ocl-icd-opencl-dev, pocl-opencl-icd)")
    ph.add_argument("--work-group", type=int, default=0, metavar="N",
                    help="with --opencl on pocl: the device's largest work-group (a phone "
                         "GPU's, e.g. 384 for a Mali Bifrost); default pocl's own")
    ph.set_defaults(func=cmd_phones)

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

    dr = sub.add_parser("doctor", help="check tools, Redis, tracker, phones; print the fix for each")
    dr.add_argument("--device-key")
    dr.add_argument("--tracker", help="HOST:PORT to check phones and run a kernel on")
    dr.add_argument("--broker")
    dr.set_defaults(func=cmd_doctor)


def _up_command(sub: Commands) -> None:
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
    u.add_argument("--prometheus-port", type=int, default=None, metavar="PORT",
                   help="also start a Prometheus on 127.0.0.1:PORT scraping the worker's "
                        "/metrics (needs `prometheus` on PATH)")
    u.set_defaults(func=cmd_up)


def _cache_commands(sub: Commands) -> None:
    c = sub.add_parser("cache", help="what the record store holds: ls, show, stats, export, "
                                     "import, rm, verify, archive",
                       description="What the record store holds. `farm cache ACTION --help` "
                                   "shows an action's arguments.")
    # the options every action took when `farm cache` had one parser: before the action
    # too (`farm cache --broker URL ls`), as each action reads them
    _cache_options(c, argparse.Namespace(
        device_key="ls, export: only this device key; import, verify: the device key (default "
                   "the config's)", json="ls, verify: the rows as JSON"), given_after=False)
    actions = c.add_subparsers(dest="action", required=True, metavar="ACTION")
    _cache_action(actions, "ls", "workloads: key, device key, trials, unverified, best, task",
                  device_key="only this device key", json="the rows as JSON")
    show = _cache_action(actions, "show", "one workload as JSON: failures, jobs, hosts, "
                                          "sources, top records",
                         json="(JSON is what show prints)")
    show.add_argument("workload_key", metavar="KEY", help="workload key (`farm cache ls`)")
    show.add_argument("--top", type=int, default=5, help="records shown (default 5)")
    _cache_action(actions, "stats", "counts, and capacity as JSON: bytes per measurement, "
                                    "measurements a day, days left",
                  json="(JSON is what stats prints)")
    ex = _cache_action(actions, "export", "the best record per workload as a MetaSchedule "
                                          "JSONDatabase", device_key="only this device key")
    ex.add_argument("folder", metavar="DIR", help="the JSONDatabase folder to write")
    ex.add_argument("--all", action="store_true",
                    help="every record (Redis's and the archive's, failures too), not only "
                         "the best of each workload")
    ex.add_argument("--format", choices=["metaschedule", "csv", "parquet"], default="metaschedule",
                    help="csv, parquet: every measurement as a row of DIR/measurements.csv or "
                         ".parquet (workload, task, device key, family, FLOPs, candidate, run "
                         "time, GFLOPS, failure, job, host, phone, source, TVM, builder, time, "
                         "verified), for pandas; parquet needs pyarrow (the [export] extra)")
    ex.add_argument("--features", action="store_true",
                    help="parquet: each measurement's cost-model features too, where cached")
    im = _cache_action(actions, "import", "seed the store from a MetaSchedule JSONDatabase "
                                          "(unverified records)",
                       device_key="the key to file the records under (default the config's)")
    im.add_argument("folder", metavar="DIR", help="the JSONDatabase folder to read")
    im.add_argument("--retarget", action="store_true",
                    help="file records tuned for another target under the profile's")
    rm = _cache_action(actions, "rm", "forget workloads, or the records of a source")
    rm.add_argument("workload_keys", nargs="?", metavar="KEY[,KEY]",
                    help="workload keys, comma-separated")
    rm.add_argument("--source", help="only the records from this job id, host or import path "
                                     "(all workloads, or the keys given)")
    ve = _cache_action(actions, "verify", "measure the stored bests again on a phone of the "
                                          "key: the drift",
                       device_key="the device key (default the config's)",
                       json="the rows as JSON")
    ve.add_argument("workload_keys", nargs="?", metavar="KEY[,KEY]",
                    help="workload keys, comma-separated (default: every best of the key)")
    ve.add_argument("--tracker", help="HOST:PORT of a tracker with phones of the key "
                                      "(default: the embedded farm's emulated phones)")
    _cache_action(actions, "archive", "move waiting records to the archive now; delete days "
                                      "past the retention")


def _cache_action(actions: Commands, name: str, text: str, device_key: str | None = None,
                  json: str | None = None) -> argparse.ArgumentParser:
    """`farm cache NAME`, with the options every action takes (`device_key`, `json`: what
    they do for this action; None: accepted as before, ignored, not shown)."""
    a = actions.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
    _cache_options(a, argparse.Namespace(device_key=device_key, json=json), given_after=True)
    a.set_defaults(func=cmd_cache)
    return a


def _cache_options(p: argparse.ArgumentParser, helps: argparse.Namespace,
                   given_after: bool) -> None:
    """--broker, --device-key, --json: on `farm cache` itself, and again on each action
    (`given_after`) with no default, so that a value given before the action is kept."""
    none = argparse.SUPPRESS if given_after else None
    p.add_argument("--broker", default=none, help="the lab farm's store (default: "
                                                  "$FARM_BROKER_URL, else the embedded farm's)")
    p.add_argument("--device-key", default=none, help=helps.device_key or argparse.SUPPRESS)
    p.add_argument("--json", action="store_true",
                   default=argparse.SUPPRESS if given_after else False,
                   help=helps.json or argparse.SUPPRESS)


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

    def on_term(signum: int, _frame: FrameType | None) -> None:
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
    except BrokenPipeError:  # `farm cache ls | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # a path or port of the user's: one line naming it, not a traceback
        if args.debug:
            raise
        where = f"{e.filename}: " if e.filename else ""
        print(f"farm: error: {where}{e.strerror or e} (check the path or address; --debug "
              f"shows where)", file=sys.stderr)
        return FarmError.exit_code


if __name__ == "__main__":
    sys.exit(main())
