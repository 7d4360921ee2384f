"""An emulated arm64 phone: TVM's runtime and a native RPC server, aarch64, under qemu.

Nothing but what a real arm64 board or phone holds: `tvm_rpc` (farm/devices/native/
tvm_rpc.cc, a C++ RPC server on TVM's runtime library only) beside the pinned TVM wheel's
own aarch64 `libtvm_runtime.so` and `libtvm_ffi.so`. No Python, no compiler: the farm
cross-compiles every candidate with `aarch64-linux-gnu-g++` (profile `arm64-sim`: the same
path an NDK profile takes) and the phone only loads and runs the shared library.

Made once and cached (in `$FARM_ARM64_ROOT`, default `$FARM_HOME/arm64-sim`): this
machine's pip downloads the aarch64 wheels of the TVM and tvm-ffi installed here, the two
libraries are taken out of them, and `tvm_rpc` is cross-compiled against the headers the
installed wheels ship. `qemu-aarch64-static -L /usr/aarch64-linux-gnu` runs it (the C
library of Debian's cross compiler): the same three files a user pushes to a board with
`adb push` and starts with `LD_LIBRARY_PATH=. ./tvm_rpc --tracker HOST:PORT --key KEY`.

Why not the runtime built from source: the wheels ship `tvm/src/runtime` but not the
headers it includes (`src/support/*.h`, `include/tvm/support/*.h`, compiler-rt's
`builtin_fp16.h`), and apache-tvm has no source distribution on PyPI; the wheel's own
aarch64 runtime is TVM's runtime at the pinned version, built by TVM's release.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

from farm.core.errors import ServiceError

log = logging.getLogger(__name__)

QEMU = "qemu-aarch64-static"
CXX = "aarch64-linux-gnu-g++"
SYSROOT = Path("/usr/aarch64-linux-gnu")  # Debian's libc6-arm64-cross (with the compiler)
TOOLS = {QEMU: "qemu-user-static", CXX: "g++-aarch64-linux-gnu"}
SOURCE = Path(__file__).with_name("native") / "tvm_rpc.cc"
# what is taken out of each aarch64 wheel: (distribution, path in the wheel)
LIBRARIES = (("apache-tvm", "tvm/lib/libtvm_runtime.so"),
             ("apache-tvm-ffi", "tvm_ffi/lib/libtvm_ffi.so"))


def missing_tools() -> list[str]:
    missing = [pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None]
    if not (SYSROOT / "lib").is_dir() and "g++-aarch64-linux-gnu" not in missing:
        missing.append("libc6-arm64-cross")
    return missing


def check_tools() -> None:
    missing = missing_tools()
    if missing:
        raise ServiceError(f"the emulated arm64 phone needs {', '.join(missing)}",
                           subject="arm64-sim",
                           hint=f"apt-get install {' '.join(missing)} (or `make system-deps` as root)")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # one set-up at a time; the others wait and reuse it
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(argv: list[str], what: str, log_file: Path) -> None:
    with open(log_file, "a") as fh:
        proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, timeout=1800)
    if proc.returncode != 0:
        raise ServiceError(f"{what} failed (exit {proc.returncode})", subject="arm64-sim",
                           hint=f"see {log_file}")


def wanted() -> list[str]:
    """The wheels the phone's libraries come from (those installed here) and its source."""
    from importlib.metadata import version

    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    return [f"{name}=={version(name)}" for name, _ in LIBRARIES] + [f"tvm_rpc.cc#{digest}"]


def prepare(base: Path) -> Path:
    """The phone's folder under `base` (tvm_rpc and its two libraries), made on first use
    (a ~100 MB download, a few seconds of compiling); returns the path of `tvm_rpc`."""
    check_tools()
    phone, stamp, log_file = base / "phone", base / "ready-native-v1", base / "setup.log"
    want = wanted()
    with locked(base / "setup.lock"):
        if stamp.is_file() and stamp.read_text().split() == want:
            return phone / "tvm_rpc"
        log.warning("arm64-sim: making the emulated arm64 phone in %s (once)", phone)
        fresh = base / "phone.new"
        shutil.rmtree(fresh, ignore_errors=True)
        fresh.mkdir(parents=True)
        _libraries(want[:len(LIBRARIES)], base / "wheels", fresh, log_file)
        _compile(fresh, log_file)
        shutil.rmtree(phone, ignore_errors=True)
        fresh.rename(phone)
        _check(phone / "tvm_rpc", base)
        stamp.write_text("\n".join(want) + "\n")
        return phone / "tvm_rpc"


def _libraries(pins: list[str], wheels: Path, into: Path, log_file: Path) -> None:
    """TVM's aarch64 runtime and FFI libraries, out of the aarch64 wheels of `pins` (the
    versions installed here)."""
    shutil.rmtree(wheels, ignore_errors=True)
    _run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(wheels),
          "--platform", "manylinux_2_28_aarch64", "--platform", "manylinux2014_aarch64",
          "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
          *pins], "pip download of the aarch64 TVM wheels", log_file)
    for name, member in LIBRARIES:
        prefix = name.replace("-", "_") + "-"
        found = [w for w in wheels.glob("*.whl") if w.name.startswith(prefix)]
        if not found:
            raise ServiceError(f"no aarch64 wheel of {name} was downloaded", subject="arm64-sim",
                               hint=f"see {log_file}")
        with zipfile.ZipFile(found[0]) as whl:
            (into / Path(member).name).write_bytes(whl.read(member))
    shutil.rmtree(wheels, ignore_errors=True)  # ~100 MB, of which 5 MB are kept


def _compile(into: Path, log_file: Path) -> None:
    """tvm_rpc, cross-compiled against the headers of the wheels installed here (the same
    versions as the libraries), finding its libraries beside itself."""
    import tvm
    import tvm_ffi

    includes = [Path(tvm_ffi.__file__).parent / "include", Path(tvm.__file__).parent / "include"]
    _run([shutil.which(CXX) or CXX, "-std=c++17", "-O2", *(f"-I{i}" for i in includes),
          str(SOURCE), f"-L{into}", "-ltvm_runtime", "-ltvm_ffi", "-Wl,-rpath,$ORIGIN",
          "-o", str(into / "tvm_rpc")], "cross-compiling tvm_rpc", log_file)


def _check(binary: Path, base: Path) -> None:
    """It runs under qemu and finds its libraries (its usage, exit 2)."""
    check = subprocess.run([*phone_argv(binary), "--help"], capture_output=True, text=True,
                           timeout=120)
    if check.returncode != 2 or "usage: tvm_rpc" not in check.stderr:
        raise ServiceError(f"the emulated arm64 phone does not start: {check.stderr[-500:]}",
                           subject=str(binary), hint=f"delete {base} and try again")


def phone_argv(binary: Path) -> list[str]:
    """The command that runs the phone's `tvm_rpc` (arguments follow)."""
    return [shutil.which(QEMU) or QEMU, "-L", str(SYSROOT), str(binary)]


def phone_env(threads: int) -> dict[str, str]:
    return {"TVM_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
