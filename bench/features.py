"""A warm round's search, with its features computed once per schedule or every time (issue 50,
issue 47's warm wall), side by side in one process.

    python bench/features.py [--batches 6] [--repeats 2] [--out bench/features.json]

A round whose cost model has learned (its workload's own records, or the key's model) scores
the evolutionary search's whole population every genetic iteration, each score a lowering of
the schedule (MetaSchedule's per-store features). This runs the farm's search (population 128,
2 iterations, batches of 16: the defaults) on three workloads (a 3x3 convolution, a depthwise
3x3 convolution, a transformer's dense layer) with an XGBoost model that ranks from its first
batch, the measured candidates committed to the search's database as a round's are, their
"run times" a fixed function of the schedule (so both sides see the same ones), once with
`CachedFeatures` (workers/metaschedule/features.py) and once with MetaSchedule's `PerStoreFeature`.
The sides start from the same random state: the same features make the same scores, so they
must propose the same candidates (checked), and the CPU of the search is the difference.
Sides alternate which runs first. No phones: the measurements are not the subject.

    python bench/features.py --first-batch

The CPU of a round's first batch of 16 by how it is made: the evolutionary search (population
128, 2 genetic iterations: MetaSchedule's way), the same with 0 iterations (the initial
population ranked, nothing evolved), the farm's ranked sample (64 random schedules ranked
once: a round the key's model ranks, workers/metaschedule/firstbatch.py) and a random replay (a
cold round's first batch). Each under a model with no samples (it scores at random: the
search's own work, without features) and under one trained on 32 schedules (it scores
with features, as the key's model does).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def workloads() -> dict[str, Any]:
    import tvm
    from tvm import te, topi

    def prim(*tensors: Any) -> Any:
        return tvm.IRModule({"main": te.create_prim_func(list(tensors))})

    x = te.placeholder((1, 64, 28, 28), name="x")
    w = te.placeholder((64, 64, 3, 3), name="w")
    conv = topi.nn.relu(topi.nn.conv2d_nchw(x, w, 1, 1, 1))
    dw_w = te.placeholder((96, 1, 3, 3), name="dw")
    dx = te.placeholder((1, 96, 28, 28), name="dx")
    dw = topi.nn.depthwise_conv2d_nchw(dx, dw_w, 1, 1, 1)
    a = te.placeholder((128, 256), name="a")
    b = te.placeholder((384, 256), name="b")
    dense = topi.nn.dense(a, b)
    return {"conv3x3": prim(x, w, conv), "depthwise": prim(dx, dw_w, dw),
            "dense": prim(a, b, dense)}


def run_side(mod: Any, cached: bool, batches: int, seed: int) -> dict[str, Any]:
    """One search of `batches` batches; CPU seconds of proposing them, the candidates."""
    import numpy as np
    import tvm
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.cost_model import XGBModel
    from tvm.s_tir.meta_schedule.database import MemoryDatabase, TuningRecord
    from tvm.s_tir.meta_schedule.feature_extractor import PerStoreFeature
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    from workers.metaschedule.features import CachedFeatures
    from workers.metaschedule.search import evolutionary

    np.random.seed(seed)  # XGBModel scores at random before its first update
    target = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    extractor = CachedFeatures() if cached else PerStoreFeature()
    ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply",
                         search_strategy=evolutionary(128, 2), task_name="bench",
                         rand_state=seed, num_threads=1)
    model = XGBModel(num_tuning_cores=1, extractor=extractor, num_warmup_samples=0)
    db = MemoryDatabase()
    workload = db.commit_workload(ctx.mod)
    strategy = ctx.search_strategy
    strategy.pre_tuning(max_trials=16 * batches, num_trials_per_iter=16,
                        design_spaces=ctx.generate_design_space(), database=db, cost_model=model)
    cpu, proposed = [], []
    for _ in range(batches):
        t0 = time.process_time()
        cands = strategy.generate_measure_candidates()
        cpu.append(time.process_time() - t0)
        if cands is None:
            break
        hashes = [int(tvm_ffi.structural_hash(c.sch.mod)) for c in cands]
        proposed.append(hashes)
        secs = [1e-4 * (1 + (h % 1000) / 1000) for h in hashes]  # the same on both sides
        results = [RunnerResult([s], None) for s in secs]
        for c, s in zip(cands, secs, strict=True):
            db.commit_tuning_record(TuningRecord(c.sch.trace, workload, [s], target,
                                                 c.args_info))
        model.update(ctx, cands, results)
        strategy.notify_runner_results(cands, results)
    strategy.post_tuning()
    out: dict[str, Any] = {"cpu_s": cpu, "proposed": proposed}
    if cached:
        out |= {"hits": extractor.hits, "computed": extractor.computed}
    return out


def _trained_model(mod: Any, target: Any, n: int) -> Any:
    """An XGBoost model trained on `n` random schedules of `mod` (run times a fixed function
    of the schedule), as a key's model that ranks a new workload has learned: it scores with
    features, not at random."""
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.cost_model import XGBModel
    from tvm.s_tir.meta_schedule.runner import RunnerResult
    from tvm.s_tir.meta_schedule.search_strategy import SearchStrategy

    from workers.metaschedule.features import CachedFeatures

    ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply",
                         search_strategy=SearchStrategy.create("replay-trace"),
                         task_name="train", rand_state=11, num_threads=1)
    s = ctx.search_strategy
    s.pre_tuning(max_trials=n, num_trials_per_iter=n, design_spaces=ctx.generate_design_space())
    cands = list(s.generate_measure_candidates() or [])
    s.post_tuning()
    model = XGBModel(num_tuning_cores=1, extractor=CachedFeatures(), num_warmup_samples=0)
    model.update(ctx, cands, [RunnerResult([1e-4 * (1 + int(tvm_ffi.structural_hash(c.sch.mod))
                                                    % 1000 / 1000)], None) for c in cands])
    return model


def first_batches() -> None:
    """`--first-batch`: the CPU of a first batch of 16, per way of making it, under a model
    that has no samples (scores at random: the search's own work) and under a trained one
    (scores with features: a round the key's model ranks)."""
    import numpy as np
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.cost_model import XGBModel
    from tvm.s_tir.meta_schedule.database import MemoryDatabase
    from tvm.s_tir.meta_schedule.search_strategy import SearchStrategy

    from workers.metaschedule.features import CachedFeatures
    from workers.metaschedule.firstbatch import RankedSample

    ways: dict[str, Any] = {
        "evolutionary, 2 iterations": lambda: SearchStrategy.create(
            "evolutionary", population_size=128, init_min_unmeasured=50, genetic_num_iters=2),
        "evolutionary, 0 iterations": lambda: SearchStrategy.create(
            "evolutionary", population_size=128, init_min_unmeasured=50, genetic_num_iters=0),
        "ranked sample of 64": lambda: RankedSample(64),
        "random replay": lambda: SearchStrategy.create("replay-trace")}
    target = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    for name, mod in workloads().items():
        for trained in (False, True):
            for way, make in ways.items():
                np.random.seed(3)
                model = _trained_model(mod, target, 32) if trained else XGBModel(
                    num_tuning_cores=1, extractor=CachedFeatures())
                strategy = make()
                ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply",
                                     search_strategy=None, task_name="bench", rand_state=5,
                                     num_threads=1)
                strategy._initialize_with_tune_context(ctx)
                db = MemoryDatabase()
                db.commit_workload(ctx.mod)
                strategy.pre_tuning(16, 16, ctx.generate_design_space(), db, model)
                t0 = time.process_time()
                got = strategy.generate_measure_candidates()
                print(f"{name:10} {'trained' if trained else 'no samples':10} {way:28} "
                      f"{len(got or [])} candidates: {time.process_time() - t0:.2f} CPU s",
                      flush=True)
                strategy.post_tuning()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=6)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "features.json")
    p.add_argument("--first-batch", action="store_true", help="a first batch's CPU, per way")
    args = p.parse_args()
    from workers.round.context import preload

    preload()
    if args.first_batch:
        first_batches()
        return 0
    rows = []
    for name, mod in workloads().items():
        for rep in range(args.repeats):
            order = (True, False) if rep % 2 == 0 else (False, True)
            got = {cached: run_side(mod, cached, args.batches, seed=17 + rep) for cached in order}
            same = got[True]["proposed"] == got[False]["proposed"]
            cached_s, plain_s = sum(got[True]["cpu_s"]), sum(got[False]["cpu_s"])
            hits, computed = got[True]["hits"], got[True]["computed"]
            rows.append({"workload": name, "repeat": rep, "batches": len(got[True]["cpu_s"]),
                         "search_cpu_s_cached": round(cached_s, 3),
                         "search_cpu_s_plain": round(plain_s, 3),
                         "ratio": round(cached_s / plain_s, 3), "same_candidates": same,
                         "hit_rate": round(hits / max(1, hits + computed), 3)})
            print(json.dumps(rows[-1]), flush=True)
    args.out.write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                    "batches": args.batches, "runs": rows}, indent=1) + "\n")
    print(f"\n{'workload':10} {'cached s':>9} {'plain s':>9} {'ratio':>6} {'hits':>5}  same")
    for name in workloads():
        mine = [r for r in rows if r["workload"] == name]
        print(f"{name:10} {statistics.median(r['search_cpu_s_cached'] for r in mine):9.2f} "
              f"{statistics.median(r['search_cpu_s_plain'] for r in mine):9.2f} "
              f"{statistics.median(r['ratio'] for r in mine):6.2f} "
              f"{statistics.median(r['hit_rate'] for r in mine):5.2f}  "
              f"{all(r['same_candidates'] for r in mine)}")
    return 0 if all(r["same_candidates"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
