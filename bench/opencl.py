"""A candidate's measurement on an OpenCL phone and on a CPU phone, side by side.

    TVM_SOURCE=../shared/tvm-src python bench/opencl.py [--rounds 5] [--work-group 256]

Starts a TVM RPC tracker, one emulated CPU phone (key cpu-local) and one emulated OpenCL phone
(key opencl-local: TVM's OpenCL runtime built from TVM_SOURCE, pocl's CPU device with the given
work-group limit), then sends `farm doctor`'s probe candidate (a 64x64 matmul + bias + relu:
tiled and vectorized for the CPU, bound to blocks and threads for the GPU) through the whole
path a round's candidate takes (built and linked here, uploaded, loaded, checked against the
reference, timed with the profile's evaluator), taking turns `--rounds` times. Prints the
kernel's time and the wall of one measurement on each, and their ratios. pocl runs OpenCL on
this machine's CPU: this is no GPU speed claim, it shows what a measurement on an OpenCL phone
costs next to a CPU phone's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--work-group", type=int, default=256)
    p.add_argument("--json", type=Path, default=ROOT / "bench" / "opencl.json")
    args = p.parse_args()
    os.environ.setdefault("TVM_SOURCE", str(ROOT.parent / "shared" / "tvm-src"))

    from farm.core.config import load_config
    from farm.core.profiles import resolve_profile
    from farm.devices.hostcpu import this_cpu
    from farm.devices.probe import probe_phone
    from farm.devices.tracker import wait_for_phones
    from farm.local import services

    with tempfile.TemporaryDirectory(prefix="bench-opencl-") as tmp:
        folder = Path(tmp)
        config = load_config({}, env={**os.environ, "FARM_HOME": str(folder / "home")})
        group = services.ServiceGroup()
        try:
            svc, tracker = services.start_tracker(folder)
            group.add(svc)
            group.add(services.start_phone(tracker, "cpu-local", 0, folder,
                                           services.PhoneOptions(), config))
            group.add(services.start_phone(tracker, "opencl-local", 0, folder,
                                           services.PhoneOptions(opencl=True,
                                                                 work_group=args.work_group),
                                           config))
            wait_for_phones(tracker, "cpu-local", 1, timeout_s=120)
            wait_for_phones(tracker, "opencl-local", 1, timeout_s=120)
            cpu = this_cpu()[0]
            profiles = {k: resolve_profile(k).on_cpu(cpu) for k in ("cpu-local", "opencl-local")}
            got: dict[str, dict[str, list[float]]] = {k: {"run_us": [], "wall_ms": []}
                                                      for k in profiles}
            for _ in range(args.rounds):
                for key, profile in profiles.items():
                    probe = probe_phone(tracker, profile)
                    got[key]["run_us"].append(probe.run_us)
                    got[key]["wall_ms"].append(probe.wall_ms)
        finally:
            group.stop()
    med = {k: {m: statistics.median(v) for m, v in d.items()} for k, d in got.items()}
    result = {
        "rounds": args.rounds, "work_group": args.work_group, "samples": got, "median": med,
        "opencl_vs_cpu": {m: round(med["opencl-local"][m] / med["cpu-local"][m], 3)
                          for m in ("run_us", "wall_ms")},
    }
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    for key, m in med.items():
        print(f"{key:13s} kernel {m['run_us']:9.1f} us   one measurement {m['wall_ms']:7.0f} ms")
    r = result["opencl_vs_cpu"]
    print(f"opencl / cpu: kernel {r['run_us']:.2f}x, measurement wall {r['wall_ms']:.2f}x "
          f"(medians of {args.rounds}, taking turns)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
