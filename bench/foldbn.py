"""Batch norms folded into their convolutions (farm/pipeline/foldbn.py): what it saves.

    python bench/foldbn.py [--models resnet,mobile,mobilenet] [--rounds 7]

For each example model (examples/make_models.py; each convolution is followed by a batch
norm with non-trivial statistics), in this one process with 1 thread: the model fused as the
farm fuses it with and without the fold, both built untuned for the target the farm tunes
(this CPU as mcpu), then timed alternately (folded, unfolded, folded, ...) `rounds` times
each (each timing the median of 30 repeats of >= 5 runs, min 50 ms). Prints per model the
medians, their ratio, the largest difference of the two outputs and the tasks each has.

Untuned builds: the ratio is the arithmetic the fold removes from TVM's default schedules,
not a tuned model's gain (that needs a tuning run a side; tuned kernels spend less of their
time on arithmetic, so expect less).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

os.environ.setdefault("TVM_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from latency import NUMBER, REPEAT, bench_profile  # noqa: E402 - bench/: this script's folder


def build_and_time(fused, target, inputs) -> tuple[float, list]:
    import tvm

    from farm.pipeline import compile as fc

    lib = fc.build(fused, target, None)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.so"
        lib.export_library(str(path))
        outs, us = fc.run_and_time(path, None, tvm.cpu(0), inputs, repeat=REPEAT, number=NUMBER)
    return us, outs


def one_model(path: Path, rounds: int) -> dict:
    import numpy as np
    import tvm

    from farm.pipeline import extract, ingest

    profile = bench_profile(1)
    bundle = ingest.load(path, threads=1)
    target = tvm.target.Target(profile.target_json())
    sides = {"folded": extract.extract(bundle.mod, profile, path.stem),
             "unfolded": extract.extract(bundle.mod, profile, path.stem, fold_bn=False)}
    times: dict[str, list[float]] = {k: [] for k in sides}
    outs = {}
    for _ in range(rounds):
        for name, ex in sides.items():
            us, outs[name] = build_and_time(ex.fused, target, bundle.inputs)
            times[name].append(us)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(outs["folded"], outs["unfolded"],
                                                           strict=True))
    folded, unfolded = median(times["folded"]), median(times["unfolded"])
    return {"model": path.stem, "tasks_folded": len(sides["folded"].tasks),
            "tasks_unfolded": len(sides["unfolded"].tasks),
            "untuned_us_folded": round(folded, 1), "untuned_us_unfolded": round(unfolded, 1),
            "ratio": round(folded / unfolded, 3), "max_abs_diff": diff,
            "runs_folded": [round(t, 1) for t in times["folded"]],
            "runs_unfolded": [round(t, 1) for t in times["unfolded"]]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="resnet,mobile,mobilenet")
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as work:
        subprocess.run([sys.executable, str(ROOT / "examples" / "make_models.py"), work],
                       check=True, capture_output=True)
        for name in filter(None, args.models.split(",")):
            print(json.dumps(one_model(Path(work) / f"{name}.pt2", args.rounds)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
