"""Host CPU per measured trial, per part, side by side (issue 50).

    python bench/cpu.py [--models bottleneck,mobile,transformer] [--trials 32]
                        [--repeats 1] [--sides now] [--out bench]

Each run is `farm submit` of a model on the embedded default (a private Redis, tracker and 2
emulated phones, a fresh FARM_HOME each run: no run starts from another's records), `--trials`
trials per task in one round per task, with a side's settings (SIDES). The figure is the
job's own CPU account (summary.json's "cpu", workers/round/account.py): the CPU seconds its
rounds took on the phone host, this process's (search, cost model, store) and its helper
processes' (builds with their linker, the measuring client), per part, divided by the trials
measured. The emulated phones' CPU is not in it: on a lab they are phones. The sides run in
turns (the first side first in even repeats), so both see the machine's same hours.

Models: `bottleneck` (a ResNet-50 bottleneck net, bench/zoo.py), `mobile` (a MobileNetV2
block: depthwise convolutions), `transformer` (a transformer encoder block); any name of
bench/zoo.py.

Writes <out>/cpu.json (every run) and prints a table per model and side: CPU s per trial in
all and per part, the wall, and the ratio of each side to the first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from run import farm_submit  # noqa: E402 - bench/: this script's folder
from zoo import write  # noqa: E402

PARTS = ("setup", "space", "search", "build", "phones", "tell", "model", "other")
# a side: the settings of `farm submit` (FARM_* variables); "now": the defaults
SIDES: dict[str, dict[str, str]] = {
    "now": {},
}


def one_run(model: Path, trials: int, side: str, work: Path) -> dict[str, Any]:
    got = farm_submit(model, trials, work / "out", work / "home", env=SIDES[side])
    cpu = got["summary"]["cpu"]
    if not got["trials"] or not cpu.get("total_s"):
        raise SystemExit(f"{model.name} ({side}): the job measured nothing or accounted no "
                         f"CPU: {json.dumps(cpu)}")
    parts = {p: cpu["phone_hosts_s"].get(p, 0.0) + cpu["helpers_s"].get(p, 0.0) for p in PARTS}
    return {"side": side, "trials": got["trials"], "wall_s": round(got["wall_s"], 1),
            "tuning_s": got["tuning_s"], "cpu_s": cpu["total_s"],
            "per_trial_s": round(cpu["total_s"] / got["trials"], 4),
            "per_trial_parts_s": {p: round(v / got["trials"], 4) for p, v in parts.items()},
            "tuned_us": got["summary"]["latency_us"]["tuned"]}


def table(name: str, runs: list[dict[str, Any]], sides: list[str]) -> list[str]:
    lines = [f"### {name}", "",
             "| side | runs | trials | CPU s / trial | " + " | ".join(PARTS) + " | wall s |",
             "|---" * (5 + len(PARTS)) + "|"]
    first = None
    for side in sides:
        mine = [r for r in runs if r["side"] == side]
        per = statistics.median(r["per_trial_s"] for r in mine)
        first = per if first is None else first
        parts = [statistics.median(r["per_trial_parts_s"][p] for r in mine) for p in PARTS]
        ratio = "" if side == sides[0] else f" ({per / first:.2f}x)"
        each = " / ".join(f"{r['per_trial_s']:.3f}" for r in mine)
        lines.append(f"| {side} | {len(mine)} | {mine[0]['trials']} | {each}{ratio} | "
                     + " | ".join(f"{v:.3f}" for v in parts)
                     + f" | {' / '.join(str(r['wall_s']) for r in mine)} |")
    return [*lines, ""]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="bottleneck,mobile,transformer")
    p.add_argument("--trials", type=int, default=32)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--sides", default="now", help=f"of {', '.join(SIDES)}")
    p.add_argument("--out", default=str(ROOT / "bench"))
    args = p.parse_args()
    sides = args.sides.split(",")
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="farm-cpu-") as tmp:
        for name in args.models.split(","):
            model = write(name, Path(tmp) / "models")
            runs: list[dict[str, Any]] = []
            for k in range(args.repeats):
                for side in (sides if k % 2 == 0 else sides[::-1]):
                    work = Path(tmp) / f"{name}-{side}-{k}"
                    runs.append(one_run(model, args.trials, side, work))
                    print(json.dumps({"model": name, **runs[-1]}), flush=True)
            results[name] = runs
    out = Path(args.out)
    (out / "cpu.json").write_text(json.dumps({"trials_per_task": args.trials,
                                              "runs": results}, indent=1) + "\n")
    for name, runs in results.items():
        print("\n".join(table(name, runs, sides)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
