"""Plain MetaSchedule on a model, the way a user would script it without the farm.

    python bench/plain.py MODEL --trials N --phones 2 --work DIR

In one process: ingest (torch.export -> Relax), fuse and extract tasks (the farm's own
code, so both sides tune the same tasks), start a TVM RPC tracker and N emulated phones
(1 thread each), for the target the farm tunes cpu-local for (this CPU as mcpu),
`ms.tune_tasks` over all tasks (LocalBuilder, RPCRunner, XGB cost
model, 16 trials per iteration, `max_trials_per_task` = N; the builder's timeout raised to
300 s, see below), then build the tuned model.
Writes DIR/plain.json: wall times of each stage, trials measured, the database folder.
bench/run.py runs this side by side with `farm submit` on the same model.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TVM_NUM_THREADS", "1")


def main() -> int:
    t_start = time.monotonic()
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--trials", type=int, required=True)
    p.add_argument("--phones", type=int, default=2)
    p.add_argument("--work", required=True)
    args = p.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)

    import tvm
    from latency import bench_profile  # bench/: this script's folder
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.runner import RPCConfig

    from farm.devices.tracker import wait_for_phones
    from farm.local import services
    from farm.pipeline import compile as fc
    from farm.pipeline import extract, ingest
    from farm.tir.module import load_mod

    profile = bench_profile(1)  # the target the farm tunes: this CPU as mcpu
    bundle = ingest.load(Path(args.model), threads=1)
    ex = extract.extract(bundle.mod, profile, Path(args.model).stem)
    target = tvm.target.Target(profile.target_json())
    t_prepared = time.monotonic()
    group = services.ServiceGroup()
    try:
        tsvc, tracker = services.start_tracker(work / "logs")
        group.add(tsvc)
        for i in range(args.phones):
            group.add(services.start_phone(tracker, "bench", i, work / "logs"))
        wait_for_phones(tracker, "bench", args.phones, 60)
        host, port = tracker.split(":")
        t_tune = time.monotonic()
        contexts = [ms.TuneContext(mod=load_mod(t), target=target,
                                   space_generator="post-order-apply",
                                   search_strategy="evolutionary", task_name=t.name)
                    for t in ex.tasks]
        (work / "db").mkdir(parents=True, exist_ok=True)
        db = ms.database.JSONDatabase(work_dir=str(work / "db"))
        ms.tune_tasks(
            tasks=contexts, task_weights=[float(t.weight) for t in ex.tasks],
            work_dir=str(work / "ms"), max_trials_global=args.trials * len(ex.tasks),
            max_trials_per_task=args.trials, num_trials_per_iter=16,
            # TVM's default build timeout is 30 s, and each build call starts fresh processes
            # that import every tensor intrinsic first (30-60 s on this 2-core machine): with
            # it, every build timed out here. 300 s lets plain MetaSchedule build.
            builder=ms.builder.LocalBuilder(timeout_sec=300),
            runner=ms.runner.RPCRunner(
                RPCConfig(host, int(port), "bench", session_timeout_sec=30),
                max_workers=args.phones),
            database=db, cost_model="xgb",
        )
        t_tuned = time.monotonic()
    finally:
        group.stop()
    lib = fc.build(ex.fused, target, db)
    lib.export_library(str(work / "model.so"))
    t_end = time.monotonic()
    (work / "plain.json").write_text(json.dumps({
        "wall_s": t_end - t_start, "prepare_s": t_prepared - t_start,
        "tune_s": t_tuned - t_tune, "compile_s": t_end - t_tuned,
        "trials": len(db.get_all_tuning_records()), "tasks": len(ex.tasks),
        "db": str(work / "db"),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
