"""An emulated arm64 phone: a TVM RPC server running aarch64 code under qemu user mode.

The set-up is made once and cached (in `$FARM_ARM64_ROOT`, default
`$FARM_HOME/arm64-sim`): a Debian bookworm arm64 root with Python 3.11
(debootstrap, unpacked without running anything arm64), and the aarch64 wheels of
the pinned TVM and its runtime needs, installed by this machine's pip into
`/opt/farm-py` of that root. `qemu-aarch64-static -L <root>` runs the root's Python
with no chroot and no binfmt_misc. The farm cross-compiles every candidate with
`aarch64-linux-gnu-g++` (profile `arm64-sim`: the same path an NDK profile takes)
and the emulated phone only loads and runs the shared library.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from farm.core.errors import ServiceError

log = logging.getLogger(__name__)

QEMU = "qemu-aarch64-static"
TOOLS = {QEMU: "qemu-user-static", "debootstrap": "debootstrap",
         "aarch64-linux-gnu-g++": "g++-aarch64-linux-gnu"}
SUITE = "bookworm"  # Debian 12: Python 3.11, like the pinned tvm-ffi wheel (cp311)
DEBS = "python3.11-minimal,libpython3.11-stdlib"
# the root's Python packages: TVM, its FFI and ml_dtypes at the versions installed here, which
# pyproject.toml pins (ml_dtypes 0.7.0 took 14 s to import under qemu, 0.6.0 4 s)
SAME_AS_HERE = ["apache-tvm", "apache-tvm-ffi", "ml_dtypes"]
OTHERS = ["numpy", "typing_extensions", "psutil", "cloudpickle", "tornado"]
SITE = "/opt/farm-py"  # inside the root
STAMP = "ready-v1"


def missing_tools() -> list[str]:
    return [pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None]


def check_tools() -> None:
    missing = missing_tools()
    if missing:
        raise ServiceError(f"the emulated arm64 phone needs {', '.join(missing)}",
                           subject="arm64-sim",
                           hint=f"apt-get install {' '.join(missing)} (or `make system-deps` as root)")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
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


def wheels() -> list[str]:
    """What pip installs into the root: SAME_AS_HERE at this machine's versions, OTHERS."""
    from importlib.metadata import version

    return [f"{name}=={version(name)}" for name in SAME_AS_HERE] + OTHERS


def prepare(base: Path, mirror: str) -> Path:
    """The arm64 root under `base` (made on first use from Debian's `mirror`, ~250 MB, a
    minute or two); returns its path. A root made with other wheels (its stamp lists them)
    gets these installed over them."""
    check_tools()
    root = base / "rootfs"
    stamp, wanted = base / STAMP, wheels()
    log_file = base / "setup.log"
    with _locked(base / "setup.lock"):
        if stamp.is_file():
            if sorted(stamp.read_text().split()) == sorted(wanted):
                _write_launcher(root)
                return root
            log.warning("arm64-sim: installing the pinned wheels into %s", root)
        else:
            log.warning("arm64-sim: making the emulated phone's arm64 root in %s (once)", base)
            _debootstrap(root, mirror, log_file)
        _install_wheels(root, wanted, log_file)
        _check_root(root, base)
        stamp.write_text("".join(f"{w}\n" for w in wanted))
        return root


def _debootstrap(root: Path, mirror: str, log_file: Path) -> None:
    if root.exists():
        shutil.rmtree(root)
    # --foreign: download and unpack, run nothing arm64 (no chroot, no binfmt_misc)
    _run(["debootstrap", "--foreign", "--arch=arm64", "--variant=minbase",
          f"--include={DEBS}", SUITE, str(root), mirror], "debootstrap of the arm64 root",
         log_file)
    for deb in sorted((root / "var/cache/apt/archives").glob("*.deb")):
        _run(["dpkg-deb", "-x", str(deb), str(root)], f"unpacking {deb.name}", log_file)
        deb.unlink()


def _install_wheels(root: Path, wanted: list[str], log_file: Path) -> None:
    """`wanted` into the root's SITE: into a new folder, then swapped in whole (pip's --target
    over an older install leaves the older versions' metadata beside the new ones)."""
    site, fresh = Path(f"{root}{SITE}"), Path(f"{root}{SITE}.new")
    shutil.rmtree(fresh, ignore_errors=True)
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(fresh),
          "--platform", "manylinux_2_28_aarch64", "--platform", "manylinux2014_aarch64",
          "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
          *wanted], "pip install of the aarch64 TVM wheels", log_file)
    shutil.rmtree(site, ignore_errors=True)
    fresh.rename(site)


def _check_root(root: Path, base: Path) -> None:
    _write_launcher(root)
    check = subprocess.run(
        [*python_argv(root), "-c", "import tvm, platform; print(platform.machine())"],
        env={**os.environ, **phone_env(1)}, capture_output=True, text=True, timeout=600)
    if check.stdout.strip() != "aarch64":
        raise ServiceError(f"TVM does not import in the arm64 root: {check.stderr[-500:]}",
                           subject=str(root), hint=f"delete {base} and try again")


def _launcher(root: Path) -> Path:
    return root / "usr/bin/python3.11-qemu"


def _write_launcher(root: Path) -> None:
    """A host shell script that runs the root's Python under qemu. It is also the emulated
    Python's sys.executable (qemu -0), so that the processes TVM starts from it (the RPC
    server's popen workers) run under qemu too: without binfmt_misc the kernel cannot exec
    an aarch64 binary."""
    qemu = shutil.which(QEMU)
    path = _launcher(root)
    text = (f"#!/bin/sh\nexec {qemu} -L {root} -0 {path} {root / 'usr/bin/python3.11'} "
            f'"$@"\n')
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
        path.chmod(0o755)


def python_argv(root: Path) -> list[str]:
    return [str(_launcher(root))]


def phone_env(threads: int) -> dict[str, str]:
    return {"PYTHONPATH": SITE, "PYTHONNOUSERSITE": "1", "TVM_NUM_THREADS": str(threads),
            "OMP_NUM_THREADS": str(threads)}
