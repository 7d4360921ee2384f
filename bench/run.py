"""Benchmarks: the farm against plain MetaSchedule on the same tasks, budget and phones.

    python bench/run.py [--models resnet,transformer] [--trials 32] [--out bench]

For each model, in one run, side by side:
1. plain MetaSchedule: `ms.tune_tasks` over the model's tasks in one process, TVM's
   LocalBuilder and RPCRunner on 2 emulated phones (a tracker, 2 rpc_servers, 1 thread each);
2. the farm: `farm submit` on the embedded default (its own Redis, tracker, 2 emulated
   phones of 1 thread, one worker), fresh store;
3. the farm again (resubmit): the store serves every task.
Both tuned models are then timed the same way in this process (VM time_evaluator,
1 thread, median of repeats). Writes <out>/results.json and <out>/results.md.
Ratios are what to read: the machine is noisy, both sides run in the same minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

os.environ.setdefault("TVM_NUM_THREADS", "1")


def plain_metaschedule(model: Path, trials: int, work: Path) -> dict:
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.runner import RPCConfig

    from farm import extract, ingest, services
    from farm.profiles import resolve_profile
    from farm.tracker import wait_for_phones

    profile = resolve_profile("cpu-local")
    bundle = ingest.load(model, threads=1)
    ex = extract.extract(bundle.mod, profile, model.stem)
    target = tvm.target.Target(profile.target_json())
    group = services.ServiceGroup()
    try:
        tsvc, tracker = services.start_tracker(work / "logs")
        group.add(tsvc)
        for i in range(2):
            group.add(services.start_phone(tracker, "bench", i, work / "logs"))
        wait_for_phones(tracker, "bench", 2, 60)
        host, port = tracker.split(":")
        t0 = time.monotonic()
        contexts = [ms.TuneContext(mod=extract.load_mod(t), target=target,
                                   space_generator="post-order-apply",
                                   search_strategy="evolutionary", task_name=t.name)
                    for t in ex.tasks]
        (work / "db").mkdir(parents=True, exist_ok=True)
        db = ms.database.JSONDatabase(work_dir=str(work / "db"))
        ms.tune_tasks(
            tasks=contexts, task_weights=[float(t.weight) for t in ex.tasks],
            work_dir=str(work / "ms"), max_trials_global=trials * len(ex.tasks),
            max_trials_per_task=trials, num_trials_per_iter=16,
            builder=ms.builder.LocalBuilder(),
            runner=ms.runner.RPCRunner(RPCConfig(host, int(port), "bench", session_timeout_sec=30),
                                       max_workers=2),
            database=db, cost_model="xgb",
        )
        wall = time.monotonic() - t0
    finally:
        group.stop()
    n = len(db.get_all_tuning_records())
    return {"wall_s": wall, "trials": n, "tasks": len(ex.tasks), "log": str(work / "db"),
            "bundle": bundle, "fused": ex.fused}


def farm_submit(model: Path, trials: int, out: Path, home: Path) -> dict:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "farm.cli", "submit", str(model),
                           "--trials-per-task", str(trials), "--round-trials", str(trials),
                           "--out", str(out), "--force"], capture_output=True, text=True,
                          env={**os.environ, "FARM_HOME": str(home)})
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"farm submit failed:\n{proc.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"wall_s": wall, "tuning_s": summary["tuning_s"], "summary": summary,
            "trials": sum(t["trials_measured"] for t in summary["tasks"]), "log": str(out / "best")}


def time_model(fused, log_dir: str, inputs, repeat: int = 30) -> float:
    import tvm
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    from farm import compile as fc
    from farm.profiles import resolve_profile

    target = tvm.target.Target(resolve_profile("cpu-local").target_json())
    ex = fc.build(fused, target, JSONDatabase(work_dir=log_dir))
    with tempfile.TemporaryDirectory() as d:
        lib = Path(d) / "m.so"
        ex.export_library(str(lib))
        _, us = fc.run_and_time(lib, None, tvm.cpu(0), inputs, repeat=repeat, number=5)
    return us


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="resnet,transformer")
    p.add_argument("--trials", type=int, default=32)
    p.add_argument("--out", default=str(ROOT / "bench"))
    args = p.parse_args()
    out = Path(args.out)
    work = Path(tempfile.mkdtemp(prefix="farm-bench-"))
    subprocess.run([sys.executable, str(ROOT / "examples" / "make_models.py"), str(work)],
                   check=True, capture_output=True)
    rows = []
    for name in args.models.split(","):
        model = work / f"{name}.pt2"
        plain = plain_metaschedule(model, args.trials, work / f"plain-{name}")
        home = work / f"home-{name}"
        first = farm_submit(model, args.trials, work / f"farm-{name}", home)
        again = farm_submit(model, args.trials, work / f"farm2-{name}", home)
        plain_us = time_model(plain["fused"], plain["log"], plain["bundle"].inputs)
        farm_us = time_model(plain["fused"], first["log"], plain["bundle"].inputs)
        row = {
            "model": name, "tasks": plain["tasks"], "trials_per_task": args.trials,
            "plain_wall_s": round(plain["wall_s"], 1), "plain_trials": plain["trials"],
            "farm_wall_s": round(first["wall_s"], 1), "farm_tuning_s": first["tuning_s"],
            "farm_trials": first["trials"],
            "ratio_farm_tuning_over_plain": round(first["tuning_s"] / plain["wall_s"], 3),
            "ratio_farm_wall_over_plain": round(first["wall_s"] / plain["wall_s"], 3),
            "plain_trials_per_min": round(plain["trials"] / plain["wall_s"] * 60, 1),
            "farm_trials_per_min": round(first["trials"] / first["tuning_s"] * 60, 1),
            "resubmit_wall_s": round(again["wall_s"], 1),
            "resubmit_trials_measured": again["trials"],
            "ratio_resubmit_over_first": round(again["wall_s"] / first["wall_s"], 3),
            "tuned_us_plain": round(plain_us, 1), "tuned_us_farm": round(farm_us, 1),
            "torch_us": round(first["summary"]["latency_us"]["torch"], 1),
            "untuned_us": round(first["summary"]["latency_us"]["untuned"], 1),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
            "how": "one run, side by side; 2 emulated phones of 1 thread each for both sides; "
                   "plain = ms.tune_tasks (LocalBuilder, RPCRunner max_workers=2, 16 trials per "
                   "iteration); farm = `farm submit` embedded, fresh store, one round per task; "
                   "farm_tuning_s = first round sent to last task finished (includes the worker's warm-up; excludes ingest "
                   "and compile); tuned latencies re-measured here with the same "
                   "build, VM time_evaluator, 1 thread, median of 30 repeats x 5 runs"}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    cols = list(rows[0]) if rows else []
    lines = [f"# tunefarm benchmarks ({meta['date']}, {meta['machine']})", "", meta["how"], "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
