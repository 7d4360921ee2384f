"""Measurement time per candidate: runtime-only phones (today) vs the full-TVM phones the farm
used before, side by side in one run.

Before (until 2026-12-05): a candidate went to the phone as a .tar of object files, the
phone (a full TVM Python install: `python -m tvm.exec.rpc_server`) linked it with its own
g++, and filled the arguments with `tvm.contrib.random` (in TVM's extra runtime library).
Now: the worker host links the .so, the phone (TVM's runtime library only) loads it as it
is, and the arguments are filled on the host and copied over (farm/devices/evaluate.py).

Each candidate is measured as the runner measures it: a new session from the tracker,
upload, load, arguments, the output check against the reference kernel, the timing, the
clean-up. The two kinds alternate, so both see the same machine. The host-side export
(what the builder's processes do per candidate) is timed apart: the link moved there.

    python bench/phones.py [--candidates 20] [--out bench/phones.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from farm.core.profiles import resolve_profile  # noqa: E402
from farm.devices.hostcpu import this_cpu  # noqa: E402
from farm.devices.tracker import request_phone, wait_for_phones  # noqa: E402
from farm.local import services  # noqa: E402

KINDS = ("full TVM phone, .tar linked on the phone", "runtime-only phone, .so linked on the host")


def export(kind: int, rt_mod: Any, work: Path) -> str:
    from tvm.support.tar import tar

    from farm.devices.cross import export_shared

    if kind == 0:
        path = work / f"cand-{time.monotonic_ns()}.tar"
        rt_mod.export_library(str(path), fcompile=tar)
        return str(path)
    return export_shared(None, rt_mod)


def measure(kind: int, tracker: str, key: str, path: str, reference: str,
            args_info: list[Any]) -> float:
    """One candidate, as the runner measures it; returns its wall time in ms."""
    from tvm.s_tir.meta_schedule.runner import EvaluatorConfig
    from tvm.s_tir.meta_schedule.runner.rpc_runner import default_alloc_argument

    from farm.devices.evaluate import alloc_on_phone, checked_run_evaluator

    profile = resolve_profile("cpu-local")
    config = EvaluatorConfig(number=profile.number, repeat=profile.repeat,
                             min_repeat_ms=profile.min_repeat_ms)
    t0 = time.perf_counter()
    session = request_phone(tracker, key, 60)
    name = os.path.basename(path)
    session.upload(path, name)
    rt_mod = session.load_module(name)
    device = session.cpu(0)
    alloc = default_alloc_argument if kind == 0 else alloc_on_phone
    args = alloc(session, device, args_info, 1)
    costs = checked_run_evaluator(reference, session, rt_mod, device, config, args)
    session.get_function("tvm.rpc.server.remove")(name)
    assert costs and all(c > 0 for c in costs)
    return (time.perf_counter() - t0) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", type=int, default=20)
    ap.add_argument("--out", default=str(ROOT / "bench" / "phones.md"))
    args = ap.parse_args()
    import tvm
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.support.tar import tar

    from farm.devices.probe import candidate, workload

    mod = workload()
    target = tvm.target.Target(resolve_profile("cpu-local").on_cpu(
        this_cpu()[0]).target_json())
    rt_mod = tvm.compile(candidate(mod), target=target)
    ref_mod = tvm.compile(mod, target=target)
    args_info = [a.as_json() for a in ArgInfo.from_prim_func(mod["main"])]
    group = services.ServiceGroup()
    with tempfile.TemporaryDirectory(prefix="farm-bench-phones-") as tmp:
        work = Path(tmp)
        refs = [str(work / "reference.tar"), str(work / "reference.so")]
        ref_mod.export_library(refs[0], fcompile=tar)
        ref_mod.export_library(refs[1])
        try:
            svc, tracker = services.start_tracker(work)
            group.add(svc)
            port = services.free_port()
            group.add(services.start("phone-full", [
                sys.executable, "-m", "tvm.exec.rpc_server", "--tracker", tracker,
                "--key", "full", "--host", "127.0.0.1", "--port", str(port),
                "--port-end", str(port + 1)], work, {"TVM_NUM_THREADS": "1"}))
            group.add(services.start_phone(tracker, "runtime", 0, work))
            wait_for_phones(tracker, "full", 1, 120)
            wait_for_phones(tracker, "runtime", 1, 120)
            wall: dict[int, list[float]] = {0: [], 1: []}
            exported: dict[int, list[float]] = {0: [], 1: []}
            for i in range(args.candidates + 1):  # the first of each kind warms up, not counted
                for kind, key in ((0, "full"), (1, "runtime")):
                    t0 = time.perf_counter()
                    path = export(kind, rt_mod, work)
                    t_export = (time.perf_counter() - t0) * 1e3
                    t_measure = measure(kind, tracker, key, path, refs[kind], args_info)
                    if i:
                        exported[kind].append(t_export)
                        wall[kind].append(t_measure)
        finally:
            group.stop()
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"# Measurement time per candidate: runtime-only vs full-TVM phones ({stamp}, "
             f"{os.cpu_count()} cores, bench/phones.py, {args.candidates} candidates each, "
             "alternating)", "",
             "Workload: a 64x64 matmul + bias + relu (farm/devices/probe.py), one scheduled "
             "candidate, the cpu-local evaluator (3 runs, >= 100 ms), phones on this machine.", "",
             "| phone | measure ms (median) | measure ms (min) | host export ms (median) |",
             "|---|---|---|---|"]
    for kind in (0, 1):
        lines.append(f"| {KINDS[kind]} | {statistics.median(wall[kind]):.1f} | "
                     f"{min(wall[kind]):.1f} | {statistics.median(exported[kind]):.1f} |")
    ratio = statistics.median(wall[1]) / statistics.median(wall[0])
    total = ((statistics.median(wall[1]) + statistics.median(exported[1]))
             / (statistics.median(wall[0]) + statistics.median(exported[0])))
    lines += ["", f"ratio runtime-only / full, measurement (median): {ratio:.3f}",
              f"ratio runtime-only / full, export + measurement (median): {total:.3f}", ""]
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    old = out.read_text() if out.is_file() else ""
    out.write_text(text + ("\n" + old if old else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
