"""`farm submit | resume | wait | status | cancel | report`: a job, from the client's side."""

# Imports inside functions: the CLI loads a command's modules when it runs (`farm
# --help` and `farm status` start in ~0.15 s, not the ~0.3 s of loading every command's).

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from farm.client.common import config_of, say, store_of
from farm.core.aliases import JsonDict
from farm.core.errors import UsageError

if TYPE_CHECKING:
    from farm.pipeline.wait import View
    from farm.store.store import FarmView


def cmd_submit(args: argparse.Namespace) -> int:
    from farm.pipeline.job import SubmitOptions, submit
    from farm.pipeline.options import check_job_name, trial_budgets

    config = config_of(args, device_key=args.device_key, round_trials=args.round_trials,
                       phones=args.phones, broker_url=args.broker)
    trials_per_task, budget = trial_budgets(args.trials_per_task, args.trials)
    opts = SubmitOptions(
        model=Path(args.model), out=Path(args.out), trials_per_task=trials_per_task,
        trials_budget=budget, early_stop_rounds=args.early_stop,
        input_shape=args.input_shape, dtype=args.dtype, allow_pickle=args.allow_pickle,
        force=args.force, wait=not args.no_wait, timeout_s=args.timeout, tracker=args.tracker,
        wait_for_devices_s=args.wait_for_devices, priority=args.priority,
        name=check_job_name(args.name),
    )
    summary = submit(opts, config, say=say, view=_live_view())
    return _print_summary(summary, opts.out, args.json)


def _live_view() -> View | None:
    """The live per-task view on a terminal; None (a line per change) otherwise."""
    from farm.client.progress import LiveView

    return LiveView() if sys.stderr.isatty() else None


def _print_summary(summary: JsonDict, out: Path, as_json: bool = False) -> int:
    """The job's result on stdout (its progress went to stderr): the table, or with
    `as_json` the summary as JSON; a job not waited for as {"job_id", "state", "out"}."""
    from farm.client.progress import format_table

    if "tasks" not in summary:
        print(json.dumps({**summary, "out": str(summary.get("out", out))}))
        return 0
    code = 0 if summary["numerics_ok"] else 7
    if as_json:
        print(json.dumps(summary, indent=2))
        return code
    print(format_table(summary))
    print(f"results in {out}/ (summary.json, best/, model.so, report.html)")
    return code


def cmd_resume(args: argparse.Namespace) -> int:
    """Continue a job from the records in the store: only what is missing is measured."""
    from farm.client.jobs import resume

    out = Path(args.out) if args.out else None
    summary = resume(args.job, config_of(args, broker_url=args.broker), say, out=out,
                     wait=not args.no_wait, timeout_s=args.timeout,
                     allow_pickle=args.allow_pickle, view=_live_view())
    return _print_summary(summary, Path(summary["out"]), args.json)


def cmd_wait(args: argparse.Namespace) -> int:
    from farm.pipeline.job import follow

    config = config_of(args, broker_url=args.broker)
    out = Path(args.out) if args.out else None
    summary = follow(args.job, config, say, out=out, force=args.force,
                     timeout_s=args.timeout, allow_pickle=args.allow_pickle,
                     view=_live_view())
    return _print_summary(summary, out or Path(summary.get("out", ".")), args.json)


def cmd_cancel(args: argparse.Namespace) -> int:
    from farm.client.jobs import cancel

    with store_of(args) as store:
        job_id = cancel(store, args.job)
    print(f"job {job_id}: cancelled; rounds not yet started will not run")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    if not (math.isfinite(args.interval) and args.interval > 0):
        raise UsageError("must be a finite number of seconds > 0",
                         subject=f"--interval {args.interval}", hint="e.g. --interval 2")
    with store_of(args) as store:
        return _status(args, store)


def _status(args: argparse.Namespace, store: FarmView) -> int:
    from farm.client.jobs import recent
    from farm.client.jobs import views as views_of
    from farm.client.progress import render

    job_ids = [store.require_job(args.job).job_id] if args.job else recent(store)
    live = getattr(args, "watch", False)
    if live and not args.json and job_ids:  # drawn in place, fitting the terminal (rich)
        from farm.client.progress import watch

        watch(store, job_ids, args.interval)
        return 0
    while True:
        views = views_of(store, job_ids)
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
    summary = _summary_of(out, StoreError)
    against = _summary_of(Path(args.against), StoreError) if args.against else None
    with store_of(args) as store:
        path = report.write(out, summary, store, against)
    print(f"wrote {path}" + (f" (against {args.against})" if against else ""))
    return 0


SUMMARY_KEYS = ("job_id", "tasks", "latency_us", "speedup", "schedules")


def _summary_of(out: Path, error: type) -> JsonDict:
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise error(f"no readable summary.json: {e}", subject=str(out),
                    hint="pass the --out folder of a finished job") from e
    missing = [k for k in SUMMARY_KEYS if not isinstance(summary, dict) or k not in summary]
    if missing:
        raise error(f"summary.json is not a job's summary (no {', '.join(missing)})",
                    subject=str(out), hint="pass the --out folder of a finished job")
    return summary
