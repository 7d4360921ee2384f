"""A model's latencies with a given number of threads: torch eager, untuned TVM and TVM built
with each given tuning log, all timed in this one fresh process, one after another.

    python bench/latency.py MODEL --threads N [--log DIR ...] [--rounds R]

Prints one JSON object: {"threads", "target", "torch_us", "torch_us_runs", "untuned_us",
"tuned_us": [...]}: torch is timed before and after TVM, and torch_us is the lower median.
TVM's thread pool takes its size from TVM_NUM_THREADS when the process first uses it, so a
thread count is a process of its own. bench/run.py times each (model, threads) 3 times
(`latencies()`, as `--rounds 3`): 3 fresh processes, the logs in another order in each, and
reports the medians over the 3; every timing is in the JSON's "rounds".

The target is the one the farm tunes `cpu-local` for (bench_profile): this machine's CPU as
mcpu and num-cores = threads. Compiling a tuned log for another target (e.g. without mcpu)
would time the farm's schedules with code LLVM made for a generic x86-64.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
REPEAT, NUMBER = 30, 5  # TVM timings: median of REPEAT, each the mean of >= NUMBER runs


def bench_profile(threads: int = 1) -> Any:
    """cpu-local as `farm submit` tunes it on this machine with `threads` threads (what a
    farm.toml `[profiles.cpu-local] threads = N` gives)."""
    from farm.core.profiles import resolve_profile
    from farm.devices.hostcpu import system_cpu

    return resolve_profile("cpu-local", {"cpu-local": {"threads": threads}}).on_cpu(system_cpu())


class Reference:
    """A model read once: its fused module, inputs and torch latency; times TVM builds of it.
    torch runs with `threads` threads; TVM with TVM_NUM_THREADS (set it to the same before
    this process first uses TVM: main() does)."""

    def __init__(self, model: Path, threads: int = 1) -> None:
        import tvm

        from farm.pipeline import extract, ingest

        profile = bench_profile(threads)
        self.bundle = ingest.load(model, threads=threads, timing_runs=REPEAT * NUMBER)
        self.fused = extract.extract(self.bundle.mod, profile, model.stem).fused
        self.target_json = profile.target_json()
        self.target = tvm.target.Target(self.target_json)

    def time_tvm(self, log_dir: str | None) -> float:
        """Latency of the model built with the records in `log_dir` (None: untuned)."""
        import tvm
        from tvm.s_tir.meta_schedule.database import JSONDatabase

        from farm.pipeline import compile as fc

        db = JSONDatabase(work_dir=log_dir) if log_dir else None
        lib = fc.build(self.fused, self.target, db)
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "m.so"
            lib.export_library(str(path))
            _, us = fc.run_and_time(path, None, tvm.cpu(0), self.bundle.inputs,
                                    repeat=REPEAT, number=NUMBER)
        return us


def latencies(model: Path, threads: int, logs: list[str], rounds: int = 3) -> dict[str, Any]:
    """Time the model `rounds` times, each in a fresh process with `threads` threads, the
    logs in another order each time (rotated, every other round reversed); the medians over
    the rounds. One timing of one log came out 2x slower than its others on this noisy
    machine (2026-12-04: 256.8 us against 121.9-131.7 in four re-timings): a single pass in
    one order can make one tuning run look like another's loss."""
    import statistics

    runs = []
    for r in range(max(1, rounds)):
        order = list(range(len(logs)))
        order = order[r % len(order):] + order[:r % len(order)] if order else order
        if r % 2:
            order.reverse()
        got = _time_once(model, threads, [logs[i] for i in order])
        tuned = [0.0] * len(logs)
        for pos, i in enumerate(order):
            tuned[i] = got["tuned_us"][pos]
        runs.append({**got, "tuned_us": tuned})
    return {"threads": threads, "target": runs[0]["target"],
            "torch_us": statistics.median(x["torch_us"] for x in runs),
            "untuned_us": statistics.median(x["untuned_us"] for x in runs),
            "tuned_us": [statistics.median(x["tuned_us"][i] for x in runs)
                         for i in range(len(logs))],
            "rounds": [{k: x[k] for k in ("torch_us", "untuned_us", "tuned_us")} for x in runs]}


def _time_once(model: Path, threads: int, logs: list[str]) -> dict[str, Any]:
    """Run this file in a fresh process with `threads` threads; its JSON."""
    import subprocess

    env = {**os.environ, "TVM_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    args = [sys.executable, str(Path(__file__).resolve()), str(model), "--threads", str(threads)]
    for log in logs:
        args += ["--log", log]
    proc = subprocess.run(args, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"timing {model.name} with {threads} thread(s) failed:\n"
                         f"{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--log", action="append", default=[], help="a tuned JSONDatabase folder")
    p.add_argument("--rounds", type=int, default=1,
                   help="> 1: time it this many times, each a fresh process, the logs in "
                        "another order each time; print the medians (latencies())")
    args = p.parse_args()
    if args.rounds > 1:
        print(json.dumps(latencies(Path(args.model), args.threads, args.log, args.rounds)))
        return 0
    if os.environ.get("TVM_NUM_THREADS") != str(args.threads):
        raise SystemExit(f"set TVM_NUM_THREADS={args.threads} in this process's environment "
                         f"(TVM sizes its thread pool from it)")
    ref = Reference(Path(args.model), args.threads)
    untuned = ref.time_tvm(None)
    tuned = [ref.time_tvm(log) for log in args.log]
    # torch once more, after TVM: a process's first timing came out up to 2x slower than
    # the next process's (bench/quality.md, 2026-12-03); the lower of the two medians counts
    from farm.pipeline import ingest

    again = ingest.load(Path(args.model), threads=args.threads,
                        timing_runs=REPEAT * NUMBER).torch_us
    print(json.dumps({"threads": args.threads, "target": ref.target_json,
                      "torch_us": min(ref.bundle.torch_us, again),
                      "torch_us_runs": [ref.bundle.torch_us, again], "untuned_us": untuned,
                      "tuned_us": tuned}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
