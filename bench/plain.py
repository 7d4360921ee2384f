"""Plain MetaSchedule on a model, the way a user would script it without the farm.

    python bench/plain.py MODEL --trials N --phones 2 --work DIR

In one process: ingest (torch.export -> Relax), fuse and extract tasks (the farm's own
code, so both sides tune the same tasks), start a TVM RPC tracker and N phones as a TVM user
starts them: TVM's own RPC server (`python -m tvm.exec.rpc_server --tracker ... --key ...`,
1 thread each; the whole TVM in Python, which links MetaSchedule's default `.tar` builds and
has the random fill its runner asks for), for the target the farm tunes cpu-local for (this
CPU as mcpu), `ms.tune_tasks` over all tasks (LocalBuilder, RPCRunner, XGB cost model, 16
trials per iteration, `max_trials_per_task` = N; the builder's timeout raised to 300 s, see
below), then build the tuned model.

The farm's own phones hold TVM's runtime only (as real phones do), and plain MetaSchedule's
defaults cannot run there: every candidate failed (2026-12-06: 161 of 161 on a residual CNN),
and its "tuned" model was the untuned one. So a run whose candidates all failed, or with a
task of no valid candidate, is an error here (exit 1, with the runner's first error), never
a baseline to compare with.

Writes DIR/plain.json: wall times of each stage, trials measured and valid (all and per
task), the database folder. bench/run.py and bench/learn.py run this side by side with
`farm submit` on the same model.
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
    import tvm_ffi
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
            port = services.free_port("127.0.0.1")
            group.add(services.start(
                f"tvm-rpc-server-{i}", [sys.executable, "-m", "tvm.exec.rpc_server",
                                        "--tracker", tracker, "--key", "bench",
                                        "--host", "127.0.0.1", "--port", str(port),
                                        "--port-end", str(port + 1)],
                work / "logs", {"TVM_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}))
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
    valid = measured(db, {tvm_ffi.structural_hash(load_mod(t)): t.name for t in ex.tasks})
    lib = fc.build(ex.fused, target, db)
    lib.export_library(str(work / "model.so"))
    t_end = time.monotonic()
    records = db.get_all_tuning_records()
    (work / "plain.json").write_text(json.dumps({
        "wall_s": t_end - t_start, "prepare_s": t_prepared - t_start,
        "tune_s": t_tuned - t_tune, "compile_s": t_end - t_tuned,
        "trials": len(records), "valid": sum(valid.values()), "valid_per_task": valid,
        "tasks": len(ex.tasks), "db": str(work / "db"),
    }))
    empty = [name for name, n in valid.items() if n == 0]
    if not records or empty:
        first = first_error(work / "ms")
        print(f"plain MetaSchedule measured no valid candidate of {len(empty)} of "
              f"{len(valid)} tasks ({', '.join(empty[:5])}): not a baseline. The runner "
              f"said: {first}", file=sys.stderr)
        return 1
    return 0


FAILED = 1e9  # MetaSchedule records a failed candidate as 1e10 s


def measured(db: object, names: dict[int, str]) -> dict[str, int]:
    """Valid candidates per task (`names`: a task's TIR's structural hash -> its name)."""
    import tvm_ffi

    out = dict.fromkeys(names.values(), 0)
    for rec in db.get_all_tuning_records():  # type: ignore[attr-defined]
        name = names.get(tvm_ffi.structural_hash(rec.workload.mod), "?")
        ok = rec.run_secs is not None and all(float(s) < FAILED for s in rec.run_secs)
        out[name] = out.get(name, 0) + int(ok)
    return out


def first_error(logs: Path) -> str:
    """The first runner or builder error in MetaSchedule's task logs."""
    for path in sorted(logs.rglob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if "Error" in line or "error_msg" in line:
                return line.strip()[:400]
    return "(no error in the task logs)"


if __name__ == "__main__":
    sys.exit(main())
