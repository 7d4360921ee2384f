"""How a candidate or a model library is exported for a device profile.

Always a shared library linked here, on the host: a phone holds TVM's runtime only (no
compiler, no linker), so it can only load a library as it is. `local`: linked by this
machine's C++ compiler (phones of this machine's CPU); `cross`: by the profile's compiler
(the Android NDK's clang++ via `$TVM_NDK_CC`, or `aarch64-linux-gnu-g++` for the emulated
arm64 phone).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from farm.core.aliases import IRModule, RuntimeModule, Schedule, Target
from farm.core.errors import UsageError
from farm.core.profiles import DeviceProfile


def compiler(profile: DeviceProfile) -> str:
    """The profile's cross compiler as a path, checked to exist and to target its triple."""
    cc = os.path.expandvars(profile.cc or "")
    hint = ("set TVM_NDK_CC to the NDK's clang++, e.g. .../toolchains/llvm/prebuilt/"
            "linux-x86_64/bin/aarch64-linux-android30-clang++"
            if "TVM_NDK_CC" in (profile.cc or "")
            else f"install it (Debian: apt-get install g++-{_triple(profile) or 'aarch64-linux-gnu'})")
    if not cc or cc.startswith("$"):
        raise UsageError(f"the profile's compiler {profile.cc!r} is not set",
                         subject=f"profile {profile.key}", hint=hint)
    path = shutil.which(cc) or (cc if Path(cc).is_file() else None)
    if path is None:
        raise UsageError(f"compiler {cc} does not exist", subject=f"profile {profile.key}",
                         hint=hint)
    return path


def _triple(profile: DeviceProfile) -> str:
    return str(profile.target.get("mtriple", ""))


def check_triple(profile: DeviceProfile) -> str:
    """`<cc> targets <machine>`, or a UsageError when it targets another CPU than the profile."""
    cc = compiler(profile)
    machine = subprocess.run([cc, "-dumpmachine"], capture_output=True, text=True,
                             timeout=30).stdout.strip()
    want = _triple(profile)
    if want and want.split("-")[0] not in machine:
        raise UsageError(f"{cc} targets {machine}, the profile needs {want}",
                         subject=f"profile {profile.key}",
                         hint="point the profile's cc (or TVM_NDK_CC) at a compiler for it")
    return f"{cc} targets {machine}"


def fcompile(profile: DeviceProfile) -> Callable[..., object] | None:
    """`export_library`'s fcompile for the profile (None: this machine's compiler, which
    `export_library` uses for a path ending in .so)."""
    from tvm.support import cc as tvm_cc

    cc = linker(profile)
    return tvm_cc.cross_compiler(cc) if cc else None


def linker(profile: DeviceProfile) -> str | None:
    """The compiler that links the profile's libraries: its own (`cross`), else None (this
    machine's: TVM's `cc.create_shared` picks $CXX, g++ or clang++)."""
    return compiler(profile) if profile.export == "cross" else None


def export_shared(cc: str | None, rt_mod: RuntimeModule) -> str:
    """A MetaSchedule builder export: the candidate linked into a .so by `cc` (None: this
    machine's compiler), in a folder of its own (the task scheduler removes the folder).
    Runs in the builder's processes; the phone only uploads and loads it."""
    from tvm.support import cc as tvm_cc

    path = os.path.join(tempfile.mkdtemp(prefix="farm-cand-"), "candidate.so")
    rt_mod.export_library(path, fcompile=tvm_cc.cross_compiler(cc) if cc else None)
    return path


def build_reference(mod: IRModule, target: Target, profile: DeviceProfile, work_dir: str) -> str:
    """The workload's unscheduled kernel, linked for the profile's phones: the reference a
    candidate's output is checked against (farm/devices/evaluate.py)."""
    import uuid

    import tvm

    if target.kind.name != "llvm":  # within what every phone GPU runs, whatever the profile says
        mod = gpu_default_schedule(mod, target, max_threads=REFERENCE_THREADS)
    lib = tvm.compile(mod, target=target)
    path = os.path.join(work_dir, f"reference-{uuid.uuid4().hex[:8]}.so")
    lib.export_library(path, fcompile=fcompile(profile))
    return path


# a GPU reference's largest work-group: a correctness oracle, not a speed baseline, it must run
# on the phone even where a profile claims more than the phone has (Mali and Adreno run 256+)
REFERENCE_THREADS = 64
DLIGHT_THREADS = 256  # the threads a block of dlight's reduction rules, whatever the target


def gpu_default_schedule(mod: IRModule, target: Target,
                         max_threads: int | None = None) -> IRModule:
    """`mod` with TVM's default GPU schedules (the dlight rules of its GPU pipeline, what an
    untuned model gets): every block bound to blocks and threads. Unscheduled, a GPU target's
    kernel is compiled as host code that writes through the device's buffer handles as if they
    were host memory: on an OpenCL phone that corrupted the session's heap (a segfault while
    the reference ran). Where a block may have fewer than 256 threads (the target's limit, or
    `max_threads`: a profile that claims more than the phone has), only dlight's fallback
    rule, which keeps within the limit (its reduction rules take 256 whatever the target)."""
    import tvm
    from tvm.s_tir import dlight as dl

    mod = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)  # the pass writes into it
    cut = within_threads(target, max_threads)
    with cut:
        return dl.ApplyDefaultSchedule(*gpu_default_rules(cut))(mod)


def within_threads(target: Target, max_threads: int | None) -> Target:
    """`target` with at most `max_threads` threads a block (None: as it is)."""
    import tvm

    have = int(target.attrs.get("max_threads_per_block", 0))
    if max_threads is None or 0 < have <= max_threads:
        return target
    return tvm.target.Target({**dict(target.export()), "max_threads_per_block": max_threads,
                              "max_num_threads": max_threads})


def gpu_default_schedule_of(mod: IRModule, target: Target) -> Schedule | None:
    """The schedule (with its trace) the first of TVM's default GPU rules that fits gives the
    function of `mod`; None when none does."""
    with target:
        for rule in gpu_default_rules(target):
            space = rule.apply(mod["main"], target, False)  # type: ignore[attr-defined]
            if space is not None:  # a Schedule, or a list of them (a tunable rule's)
                return space[0] if isinstance(space, list) else space
    return None


def gpu_default_rules(target: Target) -> list[object]:
    """The dlight rules TVM's generic GPU pipeline schedules an untuned model with, in its
    order (tvm/relax/backend/gpu_generic/pipeline.py); below 256 threads a block, only its
    fallback rule (the others take 256 whatever the target)."""
    from tvm.s_tir import dlight as dl

    if int(target.attrs.get("max_threads_per_block", 0)) < DLIGHT_THREADS:
        return [dl.gpu.Fallback()]
    return [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
            dl.gpu.Fallback()]
