"""What the farm runs on a phone to measure a candidate: nothing a phone lacks.

A phone holds TVM's runtime only (the TVM RPC app on Android, `tvm_rpc` on a board, the
farm's own phones: farm/devices/rpcd.py, farm/devices/native/). So every call here is one
the runtime library serves: upload and load of a shared library linked on the host
(farm/devices/cross.py), tensor allocation and copies, `runtime.RPCTimeEvaluator`. The
arguments are filled on the host and copied over: MetaSchedule's own filling calls
`tvm.contrib.random.random_fill_for_measure` on the phone, which lives in TVM's optional
runtime library (`libtvm_runtime_extra.so`, `USE_RANDOM`), not in every phone's runtime.

Used by the workers' runner (each candidate of a round) and by `farm doctor` (one
candidate through the same path before anything else).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from farm.core.aliases import Device, JsonList, RPCSession, RuntimeModule, TVMTensor
from farm.core.profiles import DeviceProfile

if TYPE_CHECKING:
    import numpy as np

WRONG = "wrong answer"  # the text a wrong output raises with (classified as wrong_answer)


# TVM's thread-pool affinity modes (threading_backend.h): big cores, little cores, or the
# threads free on every core (no pinning)
AFFINITY = {"big": 1, "little": -1, "": -3}


def configure_threads(session: RPCSession, threads: int, affinity: str = "") -> None:
    """Set the thread pool of `session`'s process on the phone: `threads` threads, pinned to
    the big or little cores (`affinity`) or free. TVM's runtime serves it
    (`runtime.config_threadpool`), so every phone does, the Android RPC app included; the
    setting lasts the session (each is a process of its own)."""
    session.get_function("runtime.config_threadpool")(AFFINITY[affinity], threads)


def session_threads(profile: DeviceProfile) -> tuple[int, str] | None:
    """A CPU profile's threads and affinity, for `configure_threads` in each session on its
    phones (None on a GPU: its host code runs one thread)."""
    return (profile.threads, profile.affinity) if profile.target.get("kind") == "llvm" else None


def host_values(args_info: list[JsonList], seed: int = 0) -> list[np.ndarray]:
    """numpy values for a kernel's arguments, made on the host: floats uniform in [1, 10) as
    TVM's own measurement fill makes them; integer and boolean tensors zeros (integer inputs
    are indices as often as not: an embedding's token ids, a gather's positions; random bits
    read out of bounds, a wrong answer at best, a crashed session at worst)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    values = []
    for info in args_info:
        if info[0] != "TENSOR":
            raise NotImplementedError(f"argument {info!r}: only tensors are measured")
        dtype, shape = str(info[1]), [int(d) for d in info[2]]
        if dtype.startswith(("float", "bfloat")):
            values.append(rng.uniform(1.0, 10.0, size=shape).astype(dtype))
        else:
            values.append(np.zeros(shape, dtype=dtype))
    return values


def alloc_on_phone(session: RPCSession, device: Device, args_info: list[JsonList],
                   alloc_repeat: int) -> list[list[TVMTensor]]:
    """MetaSchedule's `f_alloc_argument`: `alloc_repeat` sets of arguments on the phone,
    filled on the host (see the module's docstring)."""
    import tvm

    del session  # the device is the session's: allocation and copies go through it
    return [[tvm.runtime.tensor(v, device) for v in host_values(args_info, seed=i)]
            for i in range(alloc_repeat)]


def outputs_match(got: np.ndarray, want: np.ndarray) -> tuple[bool, float]:
    """Allclose with a tolerance relative to the reference's magnitude (float sums reorder)."""
    import numpy as np

    if got.shape != want.shape:
        return False, float("inf")
    if got.dtype.kind not in "fc":
        same = bool(np.array_equal(got, want))
        return same, 0.0 if same else 1.0
    g, w = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(w)
    if not np.array_equal(np.isfinite(g), finite):
        return False, float("inf")
    err = float(np.abs(g[finite] - w[finite]).max()) if finite.any() else 0.0
    scale = float(np.abs(w[finite]).max()) if finite.any() else 0.0
    return err <= 1e-3 * max(1.0, scale), err


def check_against(session: RPCSession, reference: str, rt_mod: RuntimeModule, device: Device,
                  args: list[TVMTensor]) -> None:
    """Run the candidate `rt_mod` and the reference kernel (a library on the host, uploaded
    here) on copies of `args` on the phone; raises RuntimeError(WRONG ...) when an output
    differs."""
    import tvm

    inputs = [a.numpy() for a in args]
    ref_mod = _loaded(session, reference)
    mine = [tvm.runtime.tensor(x, device) for x in inputs]
    theirs = [tvm.runtime.tensor(x, device) for x in inputs]
    rt_mod[rt_mod.entry_name](*mine)
    ref_mod[ref_mod.entry_name](*theirs)
    device.sync()
    for i, (m, t) in enumerate(zip(mine, theirs, strict=True)):
        ok, err = outputs_match(m.numpy(), t.numpy())
        if not ok:
            raise RuntimeError(f"{WRONG}: argument {i} differs from the unscheduled kernel's "
                               f"(max abs err {err:.3g})")


def _loaded(session: RPCSession, path: str) -> RuntimeModule:
    """The library at `path` (on the host) loaded on the phone of `session`, once per
    session: uploading it again would rewrite a library the phone has mapped (it crashes)."""
    loaded = session.__dict__.setdefault("_farm_loaded", {})
    if path not in loaded:
        session.upload(path, os.path.basename(path))
        loaded[path] = session.load_module(os.path.basename(path))
    return loaded[path]


def checked_run_evaluator(reference: str, session: RPCSession, rt_mod: RuntimeModule,
                          device: Device, evaluator_config: object,
                          repeated_args: list[list[TVMTensor]]) -> list[float]:
    """MetaSchedule's run evaluator (`runtime.RPCTimeEvaluator` on the phone), after the
    output check against the reference kernel."""
    from tvm.s_tir.meta_schedule.runner.utils import run_evaluator_common

    check_against(session, reference, rt_mod, device, repeated_args[0])
    return run_evaluator_common(rt_mod, device, evaluator_config, repeated_args)
