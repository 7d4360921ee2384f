"""Warm vs cold on a held-out model: what the key's cost model (workers/metaschedule/costmodel.py) buys a
model whose operators the store has never seen, measured side by side in one run.

    python bench/warm_model.py [--fill resnet,transformer] [--held-out mobile,mobilenet]
                               [--trials 64] [--out bench/warm_model.md] [--work DIR]

1. Fill: `farm submit` each --fill model on one farm home (the embedded default: its Redis,
   tracker, 2 emulated phones), --trials per task. Its store then holds every record of
   those jobs, and the key's model is trained on them.
2. Each held-out model is tuned twice with the same budget, the sides alternating from one
   model to the next: cold = a fresh farm home; warm = the filled home.
3. Per task, from each side's store: that job's records in measuring order. A task's
   reference is the better of the two sides' bests; "trials to 10 %" is the first trial
   whose best so far is within 10 % of it (budget + 1: not reached). A task the warm store
   already held records of (a workload shared with a fill model) is listed but left out
   of the ratio: the warm side did not have to tune it from nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from run import ROOT, farm_submit, threads_env  # bench/: this script's folder

WITHIN = 0.10


def curves(home: Path, job_id: str, workload_keys: list[str]) -> dict[str, list[float]]:
    """Per workload, the best run time so far (us) after each trial the job measured, in
    measuring order; the home's store opened once (an embedded Redis started for it)."""
    from farm.core.config import load_config
    from farm.local.embedded import embedded_store_url
    from farm.store import open_store

    out: dict[str, list[float]] = {}
    with embedded_store_url(load_config(env={"FARM_HOME": str(home)})) as url:
        store = open_store(url)
        try:
            for wk in workload_keys:
                recs = sorted((r for r in store.records(wk) if r.job_id == job_id),
                              key=lambda r: r.measured_at)
                best, points = float("inf"), []
                for r in recs:
                    if r.valid:
                        best = min(best, float(r.run_us))  # type: ignore[arg-type]
                    points.append(best)
                out[wk] = points
        finally:
            store.close()
    return out


def to_within(points: list[float], ref: float, budget: int) -> int:
    for i, best in enumerate(points):
        if best <= ref * (1 + WITHIN):
            return i + 1
    return budget + 1


def held_out(name: str, model: Path, trials: int, fill_home: Path, work: Path,
             order: tuple[str, str], seeds: str = "") -> list[dict[str, Any]]:
    runs = {}
    for side in order:
        home = fill_home if side == "warm" else work / f"home-cold-{name}"
        t0 = time.monotonic()
        runs[side] = (home, farm_submit(model, trials, work / f"{side}-{name}", home,
                                        env={**threads_env(1, work), **(
                                            {"FARM_TRANSFER_SEEDS": seeds} if seeds else {})}))
        print(f"{name} {side}: {runs[side][1]['trials']} trials, "
              f"{time.monotonic() - t0:.0f} s", flush=True)
    rows = []
    tasks = runs["cold"][1]["summary"]["tasks"]
    keys = [t["workload_key"] for t in tasks]
    by_side = {side: curves(home, run["summary"]["job_id"], keys)
               for side, (home, run) in runs.items()}
    for task in tasks:
        wk = task["workload_key"]
        warm_task = next(t for t in runs["warm"][1]["summary"]["tasks"]
                         if t["workload_key"] == wk)
        pts = {side: by_side[side][wk] for side in by_side}
        if not pts["cold"] or not pts["warm"]:
            continue  # nothing measured on one side (a single-schedule task, or all stored)
        ref = min(pts["cold"][-1], pts["warm"][-1])
        rows.append({"model": name, "task": task["name"],
                     "shared": warm_task["trials_from_store"] > 0,
                     "cold": to_within(pts["cold"], ref, trials),
                     "warm": to_within(pts["warm"], ref, trials),
                     "cold_best_us": round(pts["cold"][-1], 1),
                     "warm_best_us": round(pts["warm"][-1], 1),
                     "cold_trials": len(pts["cold"]), "warm_trials": len(pts["warm"])})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def report(rows: list[dict[str, Any]], args: argparse.Namespace, fill_s: float) -> str:
    new = [r for r in rows if not r["shared"]]
    lines = [f"# Warm vs cold on held-out models ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
             ", bench/warm_model.py)", "",
             f"`python bench/warm_model.py {' '.join(sys.argv[1:])}`. Fill: "
             f"{args.fill}{' on a copy of a home that held earlier records' if args.from_home else ''} at "
             f"{args.trials} trials per task on one farm home ({fill_s:.0f} s). Held out: "
             f"{args.held_out}, {args.trials} trials per task, once on a fresh home (cold) and "
             "once on the filled one (warm), the sides alternating. Trials to 10 %: the first "
             "trial whose best so far is within 10 % of the better side's best "
             f"({args.trials + 1} = not reached). One run per side.", "",
             "| model | task | shared with a fill model | cold: trials to 10 % | "
             "warm: trials to 10 % | cold best us | warm best us | measured cold / warm |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['task']} | {'yes' if r['shared'] else 'no'} | "
                     f"{r['cold']} | {r['warm']} | {r['cold_best_us']} | {r['warm_best_us']} | "
                     f"{r['cold_trials']} / {r['warm_trials']} |")
    if new:
        cold, warm = sum(r["cold"] for r in new), sum(r["warm"] for r in new)
        med = statistics.median(r["warm"] / r["cold"] for r in new)
        lines += ["", f"Tasks the warm store had never seen: {len(new)}. Trials to 10 %, summed: "
                  f"cold {cold}, warm {warm}: warm / cold **{warm / cold:.2f}**; median of the "
                  f"per-task ratios {med:.2f} (target <= 0.5)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fill", default="resnet,transformer")
    ap.add_argument("--held-out", default="mobile,mobilenet")
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--transfer-seeds", default="",
                    help="the held-out jobs' transfer_seeds (default: the farm's, 0: off)")
    ap.add_argument("--out", default=str(Path(__file__).with_name("warm_model.md")))
    ap.add_argument("--work", default="", help="keep the farm homes here (default: temporary)")
    ap.add_argument("--from-home", default="",
                    help="start the fill from a copy of this farm home (one no farm runs on, "
                         "e.g. a bench/run.py --work folder's home-resnet-0)")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="farm-warm-"))
    work.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, str(ROOT / "examples" / "make_models.py"), str(work)],
                   check=True, capture_output=True)
    fill_home = work / "home-warm"
    if args.from_home:
        shutil.copytree(args.from_home, fill_home)
    t0 = time.monotonic()
    for name in filter(None, args.fill.split(",")):
        run = farm_submit(work / f"{name}.pt2", args.trials, work / f"fill-{name}", fill_home,
                          env=threads_env(1, work))
        print(f"fill {name}: {run['trials']} trials, {run['wall_s']:.0f} s", flush=True)
    fill_s = time.monotonic() - t0
    rows: list[dict[str, Any]] = []
    for n, name in enumerate(filter(None, args.held_out.split(","))):
        order = ("cold", "warm") if n % 2 == 0 else ("warm", "cold")
        rows += held_out(name, work / f"{name}.pt2", args.trials, fill_home, work, order,
                         args.transfer_seeds)
    text = report(rows, args, fill_s)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
