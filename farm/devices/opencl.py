"""OpenCL for runtime-only phones: TVM's OpenCL runtime, built as a sidecar library.

The pinned TVM wheel generates OpenCL code but carries no OpenCL runtime. TVM 0.27 loads a
runtime *sidecar*, `libtvm_runtime_opencl.so`, that registers the `opencl` device and the
loader of OpenCL modules (read the wheel's `tvm/backend/opencl/__init__.py`). A phone's RPC
app has it built in; a runtime-only process gets it by loading the sidecar. This module
builds that sidecar from a TVM source tree at the pinned version (TVM's own
`src/backend/opencl/runtime` and the support headers it includes) against the installed
wheel's runtime and headers: the wheel's `tvm/src/runtime` stands in for the tree's own, so
the sidecar matches the runtime it is loaded into.

It is linked with the OpenCL ICD loader (Debian's `ocl-icd-opencl-dev`); with
`pocl-opencl-icd` the CPU is the OpenCL device, `POCL_MAX_WORK_GROUP_SIZE` its work-group
limit (a test gives it a phone GPU's). Not for the emulated arm64 phone: Debian has no aarch64
OpenCL platform for qemu to run.

The source tree: `$TVM_SOURCE` (a TVM checkout at the pinned version; the tests point it at
the project's `../shared/tvm-src`). Made once per tree and TVM version, in the
config's `opencl_dir`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from farm.core.aliases import JsonDict, RPCSession
from farm.core.config import FarmConfig
from farm.core.errors import ServiceError, UsageError
from farm.devices.arm64sim import locked
from farm.devices.tracker import request_phone

SIDECAR = "libtvm_runtime_opencl.so"
RUNTIME = "src/backend/opencl/runtime"
SOURCES = (f"{RUNTIME}/opencl_device_api.cc", f"{RUNTIME}/opencl_module.cc")
# what the build takes from the tree (the rest of TVM's runtime comes from the wheel)
TAKEN = (RUNTIME, "src/support", "include/tvm/support")
HEADERS = "/usr/include/CL/cl.h"  # Debian's opencl-headers
SOURCE_HINT = ("set TVM_SOURCE to a checkout of apache/tvm at the pinned version (git clone "
               "https://github.com/apache/tvm; git checkout the commit the installed wheel was "
               "built from): the farm takes its src/backend/opencl/runtime, src/support and "
               "include/tvm/support")


def source_tree(env: dict[str, str] | None = None) -> Path:
    """The TVM source tree the sidecar is built from; a UsageError says where it looked and
    what it missed."""
    env = dict(os.environ) if env is None else env
    value = env.get("TVM_SOURCE", "")
    if not value:
        raise UsageError("OpenCL phones need TVM's OpenCL runtime, built from a TVM source "
                         "tree, and TVM_SOURCE is not set", subject="opencl", hint=SOURCE_HINT)
    tree = Path(value).expanduser()
    missing = [p for p in (*SOURCES, f"{RUNTIME}/opencl_common.h", "src/support/utils.h",
                           "include/tvm/support/io.h") if not (tree / p).is_file()]
    if missing:
        raise UsageError(f"TVM_SOURCE={tree} is not a TVM source tree with the OpenCL runtime: "
                         f"no {', '.join(missing[:3])}" + (f" and {len(missing) - 3} more"
                                                            if len(missing) > 3 else ""),
                         subject="opencl", hint=SOURCE_HINT)
    return tree


def missing_packages() -> list[str]:
    """Debian packages the build (and an OpenCL device here) needs and this machine lacks."""
    missing = [] if Path(HEADERS).is_file() else ["opencl-headers"]
    if not _icd_loader():
        missing.append("ocl-icd-opencl-dev")
    if not any(Path("/etc/OpenCL/vendors").glob("*.icd")):
        missing.append("pocl-opencl-icd")
    return missing


def _icd_loader() -> str | None:
    """This machine's OpenCL ICD loader library, if any."""
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"):
        for name in ("libOpenCL.so", "libOpenCL.so.1"):
            if (Path(d) / name).exists():
                return str(Path(d) / name)
    return None


def _digest(tree: Path, extra: list[str]) -> str:
    h = hashlib.sha256("\n".join(extra).encode())
    for top in TAKEN:
        for p in sorted((tree / top).rglob("*")):
            if p.is_file():
                h.update(str(p.relative_to(tree)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:20]


def sidecar(base: Path, env: dict[str, str] | None = None) -> Path:
    """The sidecar for this machine, built under `base` on first use (about 10 s); returns
    its path. Raises UsageError without a source tree, ServiceError when a package is missing
    or the build fails (its log named)."""
    import tvm

    missing = missing_packages()
    if missing:
        raise ServiceError(f"OpenCL phones need {', '.join(missing)}", subject="opencl",
                           hint=f"apt-get install {' '.join(missing)} (or `make system-deps` "
                                "as root)")
    tree = source_tree(env)
    out_dir = base / "host" / _digest(tree, [tvm.__version__, "g++"])
    lib = out_dir / SIDECAR
    with locked(base / "build.lock"):
        if not lib.is_file():
            _build(tree, Path(tvm.__file__).parent, out_dir)
    return lib


def _build(tree: Path, wheel: Path, out_dir: Path) -> None:
    import tvm_ffi

    work = out_dir.with_name(out_dir.name + ".new")
    shutil.rmtree(work, ignore_errors=True)
    (work / "src").mkdir(parents=True)
    for top in TAKEN:  # the tree's OpenCL runtime and support headers, the wheel's runtime
        shutil.copytree(tree / top, work / top)
    (work / "src" / "runtime").symlink_to(wheel / "src" / "runtime")
    includes = [work / "include", work / "src", wheel / "include",
                Path(tvm_ffi.__file__).parent / "include"]
    sources = [work / s for s in SOURCES]
    links = [f"-L{wheel / 'lib'}", "-ltvm_runtime", _icd_loader() or "-lOpenCL"]
    log_file = work / "build.log"
    argv = [shutil.which("g++") or "g++", "-std=c++17", "-O2", "-shared", "-fPIC",
            "-DCL_TARGET_OPENCL_VERSION=300", *(f"-I{i}" for i in includes),
            *map(str, sources), *links, "-o", str(work / SIDECAR)]
    with open(log_file, "w") as fh:
        fh.write(" ".join(argv) + "\n")
        fh.flush()
        proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, timeout=900)
    if proc.returncode != 0:
        raise ServiceError(f"building TVM's OpenCL runtime failed (exit {proc.returncode})",
                           subject=str(tree), hint=f"see {log_file}")
    shutil.rmtree(out_dir, ignore_errors=True)
    work.rename(out_dir)


def phone_opencl(config: FarmConfig, opencl: bool,
                 work_group: int) -> tuple[list[str], tuple[Path, ...], dict[str, str]]:
    """What an emulated phone needs to have an OpenCL device (nothing without `opencl`): its
    arguments (the sidecar to load), the folder its confinement must keep visible, its
    environment (pocl's largest work-group, `work_group`; 0: pocl's own)."""
    if not opencl:
        return [], (), {}
    lib = sidecar(config.opencl_dir)
    env = {"POCL_MAX_WORK_GROUP_SIZE": str(work_group)} if work_group > 0 else {}
    return ["--opencl", str(lib)], (lib.parent,), env


# a GPU target's limits, each with what the phone's OpenCL device says of it
LIMITS = {"max_threads_per_block": "max_threads_per_block",
          "max_shared_memory_per_block": "max_shared_memory_per_block",
          "thread_warp_size": "warp_size"}


def is_gpu(target: JsonDict) -> bool:
    return target.get("kind") != "llvm"


def leaves_out_limits(target: JsonDict) -> bool:
    """A GPU target that names not all the limits a phone must then tell (not the warp size:
    TVM's OpenCL runtime reports 1 for every device)."""
    return is_gpu(target) and any(n not in target for n in LIMITS if n != "thread_warp_size")


def phone_limits(remote: RPCSession, kind: str) -> tuple[dict[str, int], str]:
    """The limits of the `kind` device (e.g. "opencl") of the phone of session `remote`, as
    target attributes, and the device's name; a RuntimeError when the phone has none."""
    dev = remote.device(kind, 0)
    if not dev.exist:
        raise RuntimeError(f"the phone has no {kind} device (its RPC app or server was built "
                           f"without {kind}, or no {kind} platform is installed on it)")
    return ({name: int(getattr(dev, attr)) for name, attr in LIMITS.items()},
            str(dev.device_name))


def claimed_limits(target: JsonDict) -> dict[str, int]:
    """The limits a profile's target claims: its own, else TVM's defaults for its kind."""
    import tvm

    attrs = tvm.target.Target(target).attrs
    return {name: int(attrs[name]) for name in LIMITS if name in attrs}


def over_limits(target: JsonDict, phone: dict[str, int]) -> list[str]:
    """What the target claims beyond the phone's limits, each naming both numbers. (Not the
    warp size: TVM's OpenCL runtime reports 1 for every device.)"""
    claimed = claimed_limits(target)
    return [f"{name} {claimed[name]} (the phone's: {have})" for name, have in phone.items()
            if name != "thread_warp_size" and claimed.get(name, 0) > have]


def with_phone_limits(target: JsonDict, phone: dict[str, int]) -> JsonDict:
    """`target` with the limits it leaves out taken from the phone."""
    filled = dict(target)
    for name, have in phone.items():
        filled.setdefault(name, have)
    if "max_threads_per_block" not in target:
        filled["max_num_threads"] = phone["max_threads_per_block"]
    return filled


# the GPU profiles a device name fits (what OpenCL's CL_DEVICE_NAME says on those phones)
_FAMILIES = ((r"mali-g(31|51|52|71|72|76)\b", "android-mali-bifrost"),
             (r"mali-g(57|68|77|78|310|510|610|710|615|715|720|925)\b", "android-mali-valhall"),
             (r"adreno.*\b6\d\d\b", "android-adreno-6xx"),
             (r"adreno.*\b7\d\d\b", "android-adreno-7xx"))


def gpu_profile_of(device_name: str) -> str | None:
    """The built-in profile of a phone GPU named `device_name`, if it is one of theirs."""
    import re

    low = device_name.lower()
    return next((key for pattern, key in _FAMILIES if re.search(pattern, low)), None)


def limits_of_key(tracker: str, key: str, target: JsonDict,
                  timeout_s: float = 120.0) -> tuple[dict[str, int], str]:
    """The GPU limits and device name of a phone of `key` that the tracker hands out."""

    remote = request_phone(tracker, key, timeout_s, priority=0)
    return phone_limits(remote, str(target.get("kind")))


def fill_limits(target: JsonDict, key: str, tracker: str | None) -> JsonDict:
    """A GPU target with the limits it leaves out read from a phone of `key` (unchanged when
    it names them all, and for a CPU). A ServiceError when it leaves some out and no phone
    can say (no tracker, no phone, no device)."""
    if not leaves_out_limits(target):
        return target
    if tracker is None:
        raise UsageError(f"the profile of key {key} leaves out its GPU's limits "
                         f"({', '.join(LIMITS)}), and no phone of the key is at hand to read them",
                         subject=f"device key {key}",
                         hint="pass --tracker HOST:PORT (a tracker with phones of the key), or "
                              "write the limits in the profile ([profiles.KEY] target)")
    try:
        limits, _ = limits_of_key(tracker, key, target)
    except Exception as e:  # noqa: BLE001 - the phone's own words
        raise ServiceError(f"cannot read the GPU limits of a phone of key {key}: {e}",
                           subject=f"tracker {tracker}",
                           hint="`farm doctor --tracker HOST:PORT --device-key KEY` checks the "
                                "phone; or write the limits in the profile") from e
    return with_phone_limits(target, limits)
