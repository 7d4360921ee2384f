"""Stage 7, compile: apply the best-config log, build, check against torch, benchmark.

The log is applied to exactly the fused module that tasks were extracted from,
so every workload key matches. Functions without a record keep TVM's default
(unscheduled) code; they are counted and named, never silently.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np

from farm.core.aliases import (
    Device,
    IRModule,
    JsonDict,
    RPCSession,
    RuntimeModule,
    Target,
    TVMDatabase,
)
from farm.core.errors import CompileError
from farm.devices.cross import gpu_default_schedule
from farm.devices.evaluate import configure_threads
from farm.devices.opencl import limits_of_key
from farm.devices.tracker import request_phone

log = logging.getLogger(__name__)
# seconds of runs a model is timed for, at most (tuned and untuned each): the phone's session
# lasts 120 s, and ResNet-18 at 224 x 224 untuned on one thread took it all (RPCSessionTimeout)
TIMING_BUDGET_S = 30.0


@dataclass
class CompileResult:
    tuned_us: float
    untuned_us: float
    numerics_ok: bool
    max_abs_err: float
    untuned_numerics_ok: bool  # False with numerics_ok False: TVM's import is wrong, not tuning
    from_log: list[str]
    fallback: dict[str, str]  # function name -> why it has no tuned schedule
    measured_on: str
    library: str
    notes: list[str] = field(default_factory=list)


def build(fused: IRModule, target: Target, database: TVMDatabase | None,
          default_threads: int | None = None) -> RuntimeModule:
    """Build the fused Relax module, applying `database` when given; on a GPU the functions
    it gives no schedule get TVM's default ones, within `default_threads` a block when given
    (the phone's own limit)."""
    import tvm
    from tvm import relax
    from tvm.relax.transform import MetaScheduleApplyDatabase

    @tvm.transform.module_pass(opt_level=3)
    def lower(mod: IRModule, _ctx: object) -> IRModule:
        if database is not None:
            mod = MetaScheduleApplyDatabase(enable_warning=False)(mod)
        passes = _default_schedule(target, default_threads) + _lower_passes(target)
        return tvm.transform.Sequential(passes)(mod)

    with target, (database if database is not None else contextlib.nullcontext()), \
            tvm.transform.PassContext(opt_level=3):
        return relax.build(fused, target=target, relax_pipeline=lower)


def _default_schedule(target: Target,
                      max_threads: int | None) -> list[Callable[[IRModule], IRModule]]:
    """On a GPU, TVM's default schedules (farm/devices/cross.py) for every function the log
    gave none (all of them when untuned), within `max_threads` a block. None on a CPU."""
    if target.kind.name == "llvm":
        return []
    import tvm

    @tvm.transform.module_pass(opt_level=0)
    def default_schedule(mod: IRModule, _ctx: object) -> IRModule:
        return gpu_default_schedule(mod, target, max_threads)

    return [default_schedule]


def _lower_passes(target: Target) -> list[Callable[[IRModule], IRModule]]:
    """The target's dataflow-lowering and finalize passes (the fused module is already legal)."""
    if target.kind.name == "llvm":
        # tvm.relax.backend.cpu_generic does not re-export these in 0.27.
        from tvm.relax.backend.cpu_generic import pipeline as cpu
    else:
        from tvm.relax import pipeline as cpu
    return list(cpu.dataflow_lower_passes(target)) + list(cpu.finalize_passes(target))


def scheduled_functions(fused: IRModule, target: Target, database: TVMDatabase) -> set[str]:
    """Names of the fused module's PrimFuncs that the log gives a schedule."""
    import tvm
    from tvm.relax.transform import MetaScheduleApplyDatabase

    with target, database, tvm.transform.PassContext(opt_level=3):
        applied = MetaScheduleApplyDatabase(enable_warning=False)(fused)
    out = set()
    for gv, func in applied.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc) and func.attrs is not None \
                and "tirx.is_scheduled" in func.attrs and bool(func.attrs["tirx.is_scheduled"]):
            out.add(gv.name_hint)
    return out


def _flatten(out: object) -> list[np.ndarray]:
    if hasattr(out, "numpy"):
        return [out.numpy()]
    if isinstance(out, (list, tuple)) or hasattr(out, "__len__"):  # a tuple, or TVM's Array
        return [a for o in cast("Iterable[object]", out) for a in _flatten(o)]
    raise CompileError(f"unexpected VM output {type(out).__name__}")


@contextlib.contextmanager
def device_session(tracker: str | None, key: str, timeout_s: float = 120.0,
                   device_type: str = "cpu"):
    """(remote, device) on a phone of `key` via the tracker (its `device_type`: "cpu",
    "opencl"), or this machine's CPU."""
    import tvm

    if tracker is None:
        yield None, tvm.cpu(0)
        return
    try:
        remote = request_phone(tracker, key, timeout_s, priority=0)
    except Exception as e:  # noqa: BLE001
        raise CompileError(f"cannot get a phone of key {key} to run the model: {e}",
                           subject=f"tracker {tracker}") from e
    yield remote, remote.device(device_type, 0)


def _loaded(lib_path: Path, remote: RPCSession | None, dev: Device,
            inputs: list[np.ndarray]) -> tuple[RuntimeModule, list[np.ndarray], float]:
    """The model's VM on the device with its inputs set; its outputs; one run's seconds (with
    the RPC round trip: an upper bound)."""
    import tvm
    from tvm import relax

    if remote is not None:
        remote.upload(str(lib_path))
        rlib = remote.load_module(lib_path.name)
    else:
        rlib = tvm.runtime.load_module(str(lib_path))
    vm = relax.VirtualMachine(rlib, dev)
    args = [tvm.runtime.tensor(x, dev) for x in inputs]
    # The stateful API works over RPC also for tuple outputs.
    vm.set_input("main", *args)
    t0 = time.perf_counter()
    vm.invoke_stateful("main")
    once = time.perf_counter() - t0
    return vm, _flatten(vm.get_outputs("main")), once


def _runs(once: float, repeat: int, number: int) -> tuple[int, int]:
    """(number, repeat) within TIMING_BUDGET_S: a big model gets fewer runs, or the phone's
    session expires."""
    if once * number * repeat > TIMING_BUDGET_S:
        return 1, max(3, min(repeat, int(TIMING_BUDGET_S / once)))
    return number, repeat


def run_and_time(lib_path: Path, remote: RPCSession | None, dev: Device,
                 inputs: list[np.ndarray], repeat: int,
                 number: int) -> tuple[list[np.ndarray], float]:
    """One library's outputs and its median run time (us)."""
    vm, outputs, once = _loaded(lib_path, remote, dev, inputs)
    number, repeat = _runs(once, repeat, number)
    timer = vm.time_evaluator("invoke_stateful", dev, number=number, repeat=repeat,
                              min_repeat_ms=50)
    return outputs, statistics.median(list(timer("main").results)) * 1e6


SIDE_BY_SIDE_TURNS = 5  # the libraries take turns this many times while they are timed


def time_side_by_side(libs: list[Path], remote: RPCSession | None, dev: Device,
                      inputs: list[np.ndarray], repeat: int,
                      number: int) -> list[tuple[list[np.ndarray], float]]:
    """Each library's outputs and median run time (us), timed taking turns (a few repeats of
    one, then of the next, ...), so that a phone or machine busy for a while slows them all
    alike rather than whichever was timed then."""
    loaded = [_loaded(lib, remote, dev, inputs) for lib in libs]
    number, repeat = _runs(max(once for _, _, once in loaded), repeat, number)
    turns = max(1, min(SIDE_BY_SIDE_TURNS, repeat))
    each = -(-repeat // turns)
    timers = [vm.time_evaluator("invoke_stateful", dev, number=number, repeat=each,
                                min_repeat_ms=50) for vm, _, _ in loaded]
    samples: list[list[float]] = [[] for _ in libs]
    for _ in range(turns):
        for timer, got in zip(timers, samples, strict=True):
            got.extend(timer("main").results)
    return [(outputs, statistics.median(got) * 1e6)
            for (_, outputs, _), got in zip(loaded, samples, strict=True)]


def matches(outs: list[np.ndarray], expected: list[np.ndarray], rtol: float,
            atol: float) -> tuple[bool, float]:
    """(every output allclose to torch's, the largest abs error; inf for a shape mismatch)."""
    ok, err = len(outs) == len(expected), 0.0
    for got, want in zip(outs, expected, strict=False):
        if got.shape != want.shape:
            ok, err = False, float("inf")
            continue
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        err = max(err, float(diff.max()) if diff.size else 0.0)
        if not np.allclose(got, want, rtol=rtol, atol=atol):
            ok = False
    return ok, err


@dataclass(frozen=True)
class ModelCheck:
    """What `compile_and_check` builds, where it runs it, and what it compares with."""

    fused: IRModule  # the fused Relax module the tasks were cut from
    target_json: JsonDict
    log_dir: Path  # the best-config log (a JSONDatabase folder)
    out_dir: Path  # where model.so goes
    inputs: list[np.ndarray]
    expected: list[np.ndarray]  # torch's outputs
    task_names: dict[str, str]  # workload key -> task name
    tuned_names: set[str]  # tasks with a best record in the log
    untunable: list[str]  # functions with no tuning task
    tracker: str | None = None  # a phone of `device_key` runs it; None: this machine's CPU
    device_key: str = "cpu-local"
    # the profile's linker (farm/devices/cross.py); None: this machine's
    fcompile: Callable[..., object] | None = None
    rtol: float = 1e-4
    atol: float = 1e-4
    repeat: int = 15
    number: int = 5
    threads: tuple[int, str] | None = None  # a CPU phone's threads and affinity (evaluate.py)


def phone_threads(check: ModelCheck, target: Target) -> int | None:
    """On a GPU, the largest work-group of a phone the model runs on: TVM's default schedules
    (the untuned model, functions without a record) keep within it where a profile claims
    more. None on a CPU, or when no phone says."""
    if target.kind.name == "llvm" or check.tracker is None:
        return None

    try:
        limits, _ = limits_of_key(check.tracker, check.device_key, check.target_json)
    except Exception as e:  # noqa: BLE001 - the profile's limits, then
        log.warning("cannot read the GPU limits of a phone of %s: %s", check.device_key, e)
        return None
    return limits["max_threads_per_block"]


def compile_and_check(check: ModelCheck) -> CompileResult:
    """Build tuned and untuned, run both on a phone, compare with torch, time them."""
    import tvm
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    target = tvm.target.Target(check.target_json)
    database = JSONDatabase(work_dir=str(check.log_dir), module_equality="structural")
    threads = phone_threads(check, target)
    try:
        tuned = build(check.fused, target, database, threads)
        untuned = build(check.fused, target, None, threads)
        from_log = scheduled_functions(check.fused, target, database)
    except Exception as e:  # noqa: BLE001
        raise CompileError(f"TVM cannot build the model with the log: {e}",
                           subject=str(check.log_dir)) from e
    fallback = {}
    for name in check.task_names.values():
        if name not in from_log:
            fallback[name] = ("not tuned: every candidate failed"
                              if name not in check.tuned_names
                              else "the log's record did not apply")
    for name in check.untunable:
        fallback[name] = "no tuning task for it"
    lib = check.out_dir / "model.so"
    untuned_lib = check.out_dir / "untuned.so"
    try:
        tuned.export_library(str(lib), fcompile=check.fcompile)
        untuned.export_library(str(untuned_lib), fcompile=check.fcompile)
    except Exception as e:  # noqa: BLE001
        raise CompileError(f"cannot export the library (is the compiler installed?): {e}",
                           subject=str(lib)) from e
    with device_session(check.tracker, check.device_key,
                        device_type=target.get_target_device_type()) as (remote, dev):
        if remote is not None and check.threads is not None:
            configure_threads(remote, *check.threads)
        (outs, tuned_us), (untuned_outs, untuned_us) = time_side_by_side(
            [lib, untuned_lib], remote, dev, check.inputs, check.repeat, check.number)
    untuned_lib.unlink(missing_ok=True)
    if len(outs) != len(check.expected):
        raise CompileError(f"the model returns {len(outs)} outputs, torch {len(check.expected)}",
                           subject=str(lib))
    ok, err = matches(outs, check.expected, check.rtol, check.atol)
    return CompileResult(
        tuned_us=tuned_us, untuned_us=untuned_us, numerics_ok=ok, max_abs_err=err,
        untuned_numerics_ok=matches(untuned_outs, check.expected, check.rtol, check.atol)[0],
        from_log=sorted(from_log), fallback=fallback,
        measured_on=(f"phone of key {check.device_key} via {check.tracker}" if check.tracker
                     else "this machine's CPU"),
        library=str(lib),
    )
