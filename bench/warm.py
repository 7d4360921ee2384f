"""Warm vs cold: trials until a new workload is within 10 % of its best, with and without the
key's cost model (workers/metaschedule/costmodel.py), measured side by side in one run.

The warm store holds 32 random, measured candidates of each of 5 matmuls
(tests/integration/test_costmodel.py's TRAIN shapes); the cold store holds nothing. Each
held-out matmul is then tuned by the farm's own rounds (workers.round.measure.run_round: real
tracker, one real emulated phone, 4 rounds of 8 trials) once against each store, the sides
alternating. A workload's reference best is the better of the two sides' bests; "trials to
10 %" is the first trial (in measuring order) whose best so far is within 10 % of it.

    .venv/bin/python bench/warm.py [--shapes 160x96x128,...] [--rounds 4] [--out bench/warm.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from farm.core.config import FarmConfig  # noqa: E402
from farm.core.messages import RoundRequest  # noqa: E402
from farm.core.profiles import resolve_profile  # noqa: E402
from farm.local import services  # noqa: E402
from farm.store import open_store  # noqa: E402
from farm.store.learned import model_key  # noqa: E402
from tests.integration.test_costmodel import TRAIN, measure_random, put_task  # noqa: E402

HELD_OUT = "160x96x128,320x64x96,112x224x160"
BATCH = 8


def tune(store, task, tracker: str, rounds: int, side: str) -> list[float]:
    """The best run time so far after each trial, in measuring order."""
    from workers.round.context import WorkerContext
    from workers.round.measure import run_round

    ctx = WorkerContext(config=FarmConfig(device_wait_s=60), tracker=tracker, host="bench")
    ranked = []
    for k in range(rounds):
        req = RoundRequest(job_id=f"bench-{side}", workload_key=task.workload_key,
                           task_name=task.name, round_index=k, trials=BATCH,
                           target_trials=BATCH * rounds, max_rounds=rounds,
                           device_key=task.device_key)
        ranked.append(run_round(ctx, store, req).ranked_by or "random")
    recs = sorted(store.records(task.workload_key), key=lambda r: r.measured_at)
    best, out = float("inf"), []
    for r in recs:
        if r.valid:
            best = min(best, float(r.run_us))  # type: ignore[arg-type]
        out.append(best)
    print(f"  {side}: {len(recs)} trials, best {best:.1f} us, round 1 ranked by {ranked[0]}",
          flush=True)
    return out


def to_within(curve: list[float], ref: float, budget: int, tol: float = 0.10) -> int:
    for i, best in enumerate(curve):
        if best <= ref * (1 + tol):
            return i + 1
    return budget + 1  # not reached in the budget


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=HELD_OUT)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default=str(Path(__file__).with_name("warm.md")))
    args = ap.parse_args()
    from farm.devices.intrinsics import load_for
    from workers.metaschedule import costmodel
    from workers.metaschedule.builder import WarmBuilder

    load_for("llvm")
    profile = resolve_profile("cpu-local", {})
    warm = open_store("memory://")
    t0 = time.monotonic()
    builder = WarmBuilder(max_workers=2)
    for i, shape in enumerate(TRAIN):
        measure_random(warm, put_task(warm, shape, profile), builder, seed=i + 1)
    builder.shutdown()
    model = costmodel.train(warm, model_key(profile.key, profile.target_json()))
    assert model is not None
    print(f"warm store: {model.describe()}, filled in {time.monotonic() - t0:.0f} s", flush=True)
    rows = []
    budget = BATCH * args.rounds
    with tempfile.TemporaryDirectory() as logs:
        group = services.ServiceGroup()
        try:
            svc, tracker = services.start_tracker(Path(logs))
            group.add(svc)
            group.add(services.start_phone(tracker, profile.key, 0, Path(logs)))
            for n, text in enumerate(args.shapes.split(",")):
                shape = tuple(int(x) for x in text.split("x"))
                print(f"matmul {text}", flush=True)
                cold = open_store("memory://")
                curves = {}
                for side in (("cold", "warm") if n % 2 == 0 else ("warm", "cold")):
                    store = warm if side == "warm" else cold
                    curves[side] = tune(store, put_task(store, shape, profile), tracker,
                                        args.rounds, side)
                ref = min(curves["cold"][-1], curves["warm"][-1])
                rows.append((text, to_within(curves["cold"], ref, budget),
                             to_within(curves["warm"], ref, budget), curves["cold"][-1],
                             curves["warm"][-1], len(curves["cold"]), len(curves["warm"])))
        finally:
            group.stop()
    lines = [f"# Warm vs cold store ({time.strftime('%Y-%m-%d')}, bench/warm.py)", "",
             f"Trials until the best so far is within 10 % of the better side's best "
             f"({budget} trials each, {budget + 1} = not reached); one run per side, "
             "this machine, 1 emulated cpu-local phone.", "",
             "| workload | cold: trials to 10 % | warm: trials to 10 % | warm / cold | "
             "cold best us | warm best us | trials measured cold / warm |",
             "|---|---|---|---|---|---|---|"]
    for text, c, w, cb, wb, cn, wn in rows:
        lines.append(f"| matmul {text} | {c} | {w} | {w / c:.2f} | {cb:.1f} | {wb:.1f} | "
                     f"{cn} / {wn} |")
    ratio = statistics.median(w / c for _, c, w, *_ in rows)
    lines += ["", f"Median warm / cold: **{ratio:.2f}** (target <= 0.5)."]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
