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

    python bench/cpu.py --recycle [--builds 192]

The helper processes' recycling alone, with no search in it: the same candidates of a 3x3
convolution (sampled once) built through the farm's builder on helper processes recycled every
64 calls and every 1024 (`builder_max_uses`), in turns, the CPU of every call counted as a
round counts it (workers/metaschedule/procs.py: a process's start lands on its first call).
"""

from __future__ import annotations

import argparse
import json
import os
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
    # the farm at issue 50's first commit (c1231a6): helper processes recycled every 64 calls,
    # 4 genetic iterations of the search per batch
    "before": {"FARM_BUILDER_MAX_USES": "64", "FARM_SEARCH_ITERS": "4"},
    "iters4": {"FARM_SEARCH_ITERS": "4"},
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


def recycling(builds: int) -> int:
    """CPU per build, helper processes recycled every 64 calls vs 1024 (see the docstring)."""
    import functools

    import tvm
    from tvm import te, topi
    from tvm.s_tir import meta_schedule as ms

    from farm.devices.cross import export_shared
    from farm.devices.intrinsics import load_for
    from farm.devices.lean import without_torch
    from workers.metaschedule.builder import WarmBuilder
    from workers.metaschedule.procs import for_rounds

    load_for("llvm")
    # the helper processes import no torch, as a worker's (farm/devices/lean.py)
    os.environ["PYTHONPATH"] = without_torch(dict(os.environ))["PYTHONPATH"]
    x, w = te.placeholder((1, 64, 28, 28), name="x"), te.placeholder((64, 64, 3, 3), name="w")
    mod = tvm.IRModule({"main": te.create_prim_func([x, w, topi.nn.conv2d_nchw(x, w, 1, 1, 1)])})
    target = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply",
                         search_strategy="replay-trace", task_name="conv", rand_state=1,
                         num_threads=1)
    ctx.pre_tuning(max_trials=builds, num_trials_per_iter=builds,
                   design_spaces=ctx.generate_design_space())
    inputs = [ms.builder.BuilderInput(c.sch.mod, target)
              for c in ctx.generate_measure_candidates()]
    per: dict[int, list[float]] = {64: [], 1024: []}
    for k in range(2):
        for uses in ((64, 1024) if k % 2 == 0 else (1024, 64)):
            processes = for_rounds(uses)
            builder = WarmBuilder(1, 60, uses, functools.partial(export_shared, None), processes)
            try:
                for i in range(0, len(inputs), 16):  # batches of 16, as a round builds them
                    for r in builder.build(inputs[i:i + 16]):
                        if r.artifact_path is not None:
                            os.remove(r.artifact_path)
                per[uses].append(builder.pool.cpu_s / len(inputs))
            finally:
                builder.shutdown()
                processes.shutdown()
            print(json.dumps({"max_uses": uses, "builds": len(inputs),
                              "cpu_per_build_s": round(per[uses][-1], 4)}), flush=True)
    a, b = statistics.median(per[64]), statistics.median(per[1024])
    print(f"CPU per build: recycled every 64 calls {a:.4f} s, every 1024 {b:.4f} s: "
          f"{b / a:.3f}x ({len(inputs)} builds, 2 runs a side)")
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="bottleneck,mobile,transformer")
    p.add_argument("--trials", type=int, default=32)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--sides", default="now", help=f"of {', '.join(SIDES)}")
    p.add_argument("--out", default=str(ROOT / "bench"))
    p.add_argument("--recycle", action="store_true", help="the helper processes' recycling only")
    p.add_argument("--builds", type=int, default=192)
    args = p.parse_args()
    if args.recycle:
        return recycling(args.builds)
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
