"""Tuning quality of the farm's search against the farm before it changed (issue 38).

    python bench/ahead.py [--model mobile] [--trials 64] [--repeats 3]
                          [--sides now,before] [--out bench]

Each side is `farm submit` of the same example model (examples/make_models.py) on the
embedded default (a private Redis, tracker and 2 emulated phones of 1 thread, a fresh FARM_HOME
each run, so no run starts from another's records), `--trials` trials per task in one round
per task, with the side's settings (SIDES):
- now: the defaults (a round searches batch k+1 while batch k is measured,
  workers/round/loop.py; an evolutionary population of 128 per batch of 16);
- before: the farm before 2026-12-05 (search, build, measure one after another, as
  MetaSchedule's tune_tir does, FARM_SEARCH_AHEAD=0; population 512, MetaSchedule's default);
- ahead / serial: a batch ahead or not, population 512 both (the 2026-12-05 run).
The runs alternate sides (the first side first in even repeats, last in odd ones). Then every
tuned log is timed in fresh processes, 3 times in rotated orders (bench/latency.py
`latencies`), and each side's median tuned latency over its runs is compared: the target is
within 2 %.

Writes <out>/ahead.json and <out>/ahead.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from latency import latencies  # noqa: E402 - bench/: this script's folder
from run import farm_submit  # noqa: E402

SIDES = {
    "now": {},
    "before": {"FARM_SEARCH_AHEAD": "0", "FARM_SEARCH_POPULATION": "512"},
    "ahead": {"FARM_SEARCH_AHEAD": "1", "FARM_SEARCH_POPULATION": "512"},
    "serial": {"FARM_SEARCH_AHEAD": "0", "FARM_SEARCH_POPULATION": "512"},
    # issue 50 (bench/cpu.md): the search's genetic iterations per batch
    "iters4": {"FARM_SEARCH_ITERS": "4"},
    "iters2": {"FARM_SEARCH_ITERS": "2"},
    "iters3": {"FARM_SEARCH_ITERS": "3"},
    # a blind search (its model below the warm-up: every round of a fresh farm at <= 64
    # trials a task) evolving a population of 64 once a batch, not 128 twice (bench/learn.md)
    "small": {"FARM_SEARCH_POPULATION": "64", "FARM_SEARCH_ITERS": "1"},
}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mobile")
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sides", default="now,before", help=f"two of {', '.join(SIDES)}")
    p.add_argument("--out", default=str(ROOT / "bench"))
    args = p.parse_args()
    first, second = args.sides.split(",")
    sys.path.insert(0, str(ROOT / "examples"))
    from make_models import write

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ahead-") as d:
        work = Path(d)
        model, _ = write(args.model, work / "models")
        for r in range(args.repeats):
            for side in [first, second] if r % 2 == 0 else [second, first]:
                run_dir = work / f"r{r}-{side}"
                got = farm_submit(model, args.trials, run_dir / "out", run_dir / "home",
                                  env=SIDES[side])
                row = {"repeat": r, "side": side, "tuning_s": got["tuning_s"],
                       "trials": got["trials"], "measure_s": round(got["measure_s"], 1),
                       "cpu_per_trial_s": got["summary"]["cpu"]["per_trial_s"],
                       "log": got["log"]}
                print(json.dumps(row), flush=True)
                runs.append(row)
        lat = latencies(model, 1, [r["log"] for r in runs])
    for row, us in zip(runs, lat["tuned_us"], strict=True):
        row["tuned_us"] = round(us, 2)
        del row["log"]
    by = {s: [r for r in runs if r["side"] == s] for s in (first, second)}
    med = {s: statistics.median(r["tuned_us"] for r in rows) for s, rows in by.items()}
    tun = {s: statistics.median(r["tuning_s"] for r in rows) for s, rows in by.items()}
    result = {"started": started, "model": args.model, "trials": args.trials,
              "repeats": args.repeats, "sides": {s: SIDES[s] for s in (first, second)},
              "runs": runs, "torch_us": lat["torch_us"], "untuned_us": lat["untuned_us"],
              "median_tuned_us": med, "ratio": round(med[first] / med[second], 4),
              "median_tuning_s": tun}
    out = Path(args.out)
    (out / "ahead.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "ahead.md").write_text(_markdown(result, first, second))
    print(json.dumps({k: result[k] for k in ("median_tuned_us", "ratio", "median_tuning_s")}))
    return 0


def _markdown(res: dict[str, Any], first: str, second: str) -> str:
    sides = ", ".join(f"{s}: {' '.join(f'{k}={v}' for k, v in env.items()) or 'the defaults'}"
                      for s, env in res["sides"].items())
    lines = [f"# Tuning quality, {first} vs {second} ({res['started']}, {res['model']}, "
             f"{res['trials']} trials a task, {res['repeats']} runs a side)", "",
             f"`python bench/ahead.py --sides {first},{second}` (see its docstring); {sides}. "
             "Tuned latency: each log timed in 3 fresh processes (bench/latency.py), median.", "",
             "| repeat | side | tuning s | trials | phones' measure s | host CPU s / trial | "
             "tuned us |", "|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        lines.append(f"| {r['repeat']} | {r['side']} | {r['tuning_s']} | {r['trials']} | "
                     f"{r['measure_s']} | {r.get('cpu_per_trial_s', '-')} | {r['tuned_us']} |")
    m, t = res["median_tuned_us"], res["median_tuning_s"]
    mean = {s: statistics.mean(r["tuned_us"] for r in res["runs"] if r["side"] == s)
            for s in (first, second)}
    spread = {s: (min(r["tuned_us"] for r in res["runs"] if r["side"] == s),
                  max(r["tuned_us"] for r in res["runs"] if r["side"] == s))
              for s in (first, second)}
    lines += ["", f"Median tuned latency: {first} **{m[first]:.2f} us**, {second} "
              f"**{m[second]:.2f} us**: ratio **{res['ratio']}** (target: within 2 %); mean "
              f"{mean[first]:.2f} vs {mean[second]:.2f} us, runs {spread[first][0]}-"
              f"{spread[first][1]} vs {spread[second][0]}-{spread[second][1]} us. Torch "
              f"{res['torch_us']:.1f} us, untuned {res['untuned_us']:.1f} us. Median tuning "
              f"wall: {first} {t[first]} s, {second} {t[second]} s.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
