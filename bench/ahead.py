"""Tuning quality with the search a batch ahead of the phones, against the farm without it.

    python bench/ahead.py [--model mobile] [--trials 64] [--repeats 3] [--out bench]

Each side is `farm submit` of the same example model (examples/make_models.py) on the
embedded default (a private Redis, tracker and 2 emulated phones of 1 thread, a fresh FARM_HOME
each run, so no run starts from another's records), `--trials` trials per task in one round
per task: FARM_SEARCH_AHEAD=1 (a round searches batch k+1 while batch k is measured,
workers/round/pipeline.py) against FARM_SEARCH_AHEAD=0 (search, build, measure one after
another, as MetaSchedule's tune_tir does and the farm did before). The runs alternate sides
(ahead first in odd repeats, last in even ones). Then every tuned log is timed in fresh
processes, 3 times in rotated orders (bench/latency.py `latencies`), and each side's median
tuned latency over its runs is compared: the target is within 2 %.

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


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mobile")
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "bench"))
    args = p.parse_args()
    sys.path.insert(0, str(ROOT / "examples"))
    from make_models import write

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ahead-") as d:
        work = Path(d)
        model, _ = write(args.model, work / "models")
        for r in range(args.repeats):
            sides = [1, 0] if r % 2 == 0 else [0, 1]
            for ahead in sides:
                run_dir = work / f"r{r}-ahead{ahead}"
                got = farm_submit(model, args.trials, run_dir / "out", run_dir / "home",
                                  env={"FARM_SEARCH_AHEAD": str(ahead)})
                row = {"repeat": r, "ahead": ahead, "tuning_s": got["tuning_s"],
                       "trials": got["trials"], "measure_s": round(got["measure_s"], 1),
                       "log": got["log"]}
                print(json.dumps(row), flush=True)
                runs.append(row)
        lat = latencies(model, 1, [r["log"] for r in runs])
    for row, us in zip(runs, lat["tuned_us"], strict=True):
        row["tuned_us"] = round(us, 2)
        del row["log"]
    sides = {a: [r for r in runs if r["ahead"] == a] for a in (1, 0)}
    med = {a: statistics.median(r["tuned_us"] for r in rows) for a, rows in sides.items()}
    tun = {a: statistics.median(r["tuning_s"] for r in rows) for a, rows in sides.items()}
    result = {"started": started, "model": args.model, "trials": args.trials,
              "repeats": args.repeats, "runs": runs, "torch_us": lat["torch_us"],
              "untuned_us": lat["untuned_us"], "median_tuned_us": {"ahead": med[1], "serial": med[0]},
              "ratio_ahead_to_serial": round(med[1] / med[0], 4),
              "median_tuning_s": {"ahead": tun[1], "serial": tun[0]}}
    out = Path(args.out)
    (out / "ahead.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "ahead.md").write_text(_markdown(result))
    print(json.dumps({k: result[k] for k in ("median_tuned_us", "ratio_ahead_to_serial",
                                             "median_tuning_s")}))
    return 0


def _markdown(res: dict[str, Any]) -> str:
    lines = [f"# Search ahead vs serial ({res['started']}, {res['model']}, "
             f"{res['trials']} trials a task, {res['repeats']} runs a side)", "",
             "`python bench/ahead.py` (see its docstring). Tuned latency: each log timed in 3 "
             "fresh processes (bench/latency.py), median.", "",
             "| repeat | search ahead | tuning s | trials | phones' measure s | tuned us |",
             "|---|---|---|---|---|---|"]
    for r in res["runs"]:
        lines.append(f"| {r['repeat']} | {'yes' if r['ahead'] else 'no'} | {r['tuning_s']} | "
                     f"{r['trials']} | {r['measure_s']} | {r['tuned_us']} |")
    m = res["median_tuned_us"]
    lines += ["", f"Median tuned latency: ahead **{m['ahead']:.2f} us**, serial "
              f"**{m['serial']:.2f} us**: ratio **{res['ratio_ahead_to_serial']}** "
              f"(target: within 2 %). Torch {res['torch_us']:.1f} us, untuned "
              f"{res['untuned_us']:.1f} us. Median tuning wall: ahead "
              f"{res['median_tuning_s']['ahead']} s, serial {res['median_tuning_s']['serial']} s.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
