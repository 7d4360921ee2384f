"""A phone's thermometer: one fixed kernel, timed now and then, against the phone's own best.

A phone slows as it heats (its governor lowers the clocks), and a round that measures on a
throttled phone ranks its candidates by the phone's temperature, not by their speed. So a
round's sessions time the same small kernel on a phone every `heat_check_s` (a profile
setting): `farm doctor`'s probe candidate (a tiled matmul + bias + relu, 64x64), built once
per process for the profile's target and linked like any candidate. Its time needs nothing
a phone lacks (upload, load, `runtime.RPCTimeEvaluator`) and reads a GPU the same way.

The reading is compared by the round with the phone's baseline, the fastest reading the store
has of that phone (workers/metaschedule/phonelog.py, farm/store/phones.py): a phone more than
`heat_share` slower than its baseline is hot.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

from farm.core.aliases import RPCSession
from farm.core.profiles import DeviceProfile
from farm.devices.cross import export_shared, linker
from farm.devices.evaluate import host_values
from farm.devices.probe import candidate, workload

READING_MS = 10  # a measurement runs the kernel (~25 us on a desktop core) for at least this
# measurements a reading takes the median of: a moment's noise (or a burst a phone gets as it
# wakes) moves one or two of them, heat moves them all
READING_REPEAT = 5
_BUILT: dict[tuple[str, str], str] = {}  # (target, linker) -> the kernel's library, this process


@dataclass(frozen=True)
class Thermometer:
    """What a session needs to read a phone's thermometer: the kernel's library (on this
    host), the device it runs on and how often a phone is read (seconds)."""

    path: str
    device: int  # the device type it runs on (the target's: the CPU, or OpenCL's)
    every_s: float


def thermometer(profile: DeviceProfile) -> Thermometer | None:
    """The profile's thermometer, built once per process; None when its `heat_check_s` is 0.
    Raises what TVM's build raises (the runner then tunes without heat checks, logged)."""
    if profile.heat_check_s <= 0:
        return None
    import tvm

    target = tvm.target.Target(profile.target_json())
    cc = linker(profile)
    known = (str(target), cc or "")
    if known not in _BUILT or not os.path.exists(_BUILT[known]):
        gpu = target.kind.name != "llvm"
        _BUILT[known] = export_shared(cc, tvm.compile(candidate(workload(), gpu), target=target))
    return Thermometer(_BUILT[known], target.get_target_device_type(), profile.heat_check_s)


def read(session: RPCSession, thermo: Thermometer) -> float:
    """The kernel's time on the phone of `session`, in microseconds: the median of
    READING_REPEAT measurements of at least READING_MS each (~50 ms a reading)."""
    import numpy as np
    import tvm

    name = f"thermometer-{uuid.uuid4().hex[:8]}.so"  # never a library the phone has mapped
    session.upload(thermo.path, name)
    mod = session.load_module(name)
    dev = session.device(thermo.device, 0)
    args = [tvm.runtime.tensor(v, dev) for v in host_values(
        [["TENSOR", "float32", [64, 64]]] * 3, seed=7)]
    timer = mod.time_evaluator(mod.entry_name, dev, number=1, repeat=READING_REPEAT,
                               min_repeat_ms=READING_MS)
    return float(np.median(timer(*args).results)) * 1e6
