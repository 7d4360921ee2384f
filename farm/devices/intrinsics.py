"""The tensor intrinsics a target can use, registered without the ones it cannot.

MetaSchedule's TuneContext imports `tvm.s_tir.tensor_intrin`, whose package import
parses every intrinsic TVM ships as TVMScript: CUDA (tensor cores, ~22 s), ROCm, Metal,
Hexagon, Arm, x86 and RISC-V; 30-40 s in each process that tunes, on a busy 2-core host.
A CPU target (kind "llvm": x86 hosts, Arm phones) schedules only with the x86, Arm and
RISC-V ones (VNNI/AVX-512, NEON dot products), which take under 4 s.

A phone GPU's target (kind "opencl": Mali, Adreno; "vulkan", "metal", "webgpu") is scheduled
by MetaSchedule's GPU rules (its rule kind "cuda": tiling, thread binding, cross-thread
reduction), which tensorize nothing: it needs no GPU intrinsic either, and each of a worker's
round processes is spared ~25 s of CPU before its first OpenCL round. CUDA (tensor cores from
sm_75: "cuda-tensorcore"), ROCm and Hexagon load their own module; a kind the farm does not
know loads them all.

`load_for(target_kind)` registers the CPU ones and, for such a target, the rest. It stands
in for the package's own `__init__` (a module object with the package's path, put in
`sys.modules` first), so a later `import tvm.s_tir.tensor_intrin` (TuneContext's) finds
the registry loaded and parses nothing again; `import tvm.s_tir.tensor_intrin.cuda`
still works whenever something asks for it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

PACKAGE = "tvm.s_tir.tensor_intrin"
CPU = ("dot_product_common", "x86", "arm_cpu", "riscv_cpu")
GPU = ("cuda", "rocm", "metal", "hexagon")
# target kinds whose default schedule rules use no tensor intrinsic beyond the CPU ones
UNTENSORIZED = ("llvm", "opencl", "vulkan", "metal", "webgpu")
# a kind that tensorizes takes its own module's (each stands alone); an unknown kind all
OWN = {"cuda": ("cuda",), "rocm": ("rocm",), "hexagon": ("hexagon",)}


def _package() -> types.ModuleType:
    """The intrinsics package, imported without its `__init__` when nothing imported it yet."""
    if PACKAGE in sys.modules:
        return sys.modules[PACKAGE]
    import tvm.s_tir

    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:  # an unknown TVM layout: the real one
        return importlib.import_module(PACKAGE)
    pkg = types.ModuleType(PACKAGE, "Intrinsics for tensorization (loaded by farm.devices)")
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__spec__ = spec
    pkg.__file__ = spec.origin
    pkg.__package__ = PACKAGE
    sys.modules[PACKAGE] = pkg
    tvm.s_tir.tensor_intrin = pkg  # type: ignore[attr-defined]
    return pkg


def load_for(target_kind: str = "llvm") -> list[str]:
    """Register the intrinsics a target of `target_kind` can use (the CPU ones, and a kind
    not in UNTENSORIZED its own or, unknown, all); returns the modules loaded now."""
    _package()
    wanted = CPU if target_kind in UNTENSORIZED else CPU + OWN.get(target_kind, GPU)
    loaded = []
    for name in wanted:
        full = f"{PACKAGE}.{name}"
        if full not in sys.modules:
            importlib.import_module(full)
            loaded.append(name)
    return loaded
