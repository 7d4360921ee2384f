"""Helpers for tests that run the real `farm` command."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil


def run_farm(args: list[str], home: Path, timeout_s: float = 1200,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "FARM_HOME": str(home), **(env or {})}
    full_env.pop("FARM_BROKER_URL", None) if "FARM_BROKER_URL" not in (env or {}) else None
    return subprocess.run([sys.executable, "-m", "farm", *args], capture_output=True,
                          text=True, timeout=timeout_s, env=full_env)


@contextlib.contextmanager
def tvm_children_without_torch() -> Iterator[None]:
    """TVM's build and run processes started in this block (`python -m
    tvm.exec.popen_worker`, by LocalRunner, LocalBuilder, WarmBuilder) import no torch, as
    the farm's own workers do (farm/devices/lean.py): ~3 s of CPU less each. Only for the
    block: a `farm submit` started later needs torch."""
    from farm.devices.lean import without_torch

    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = without_torch(dict(os.environ))["PYTHONPATH"]
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def ctrl_c_works() -> None:
    """preexec_fn for a child that the test stops with SIGINT (Ctrl-C): a test run started in
    the background of a shell ignores SIGINT, and its children would inherit that."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def started_pids(home: Path) -> list[tuple[int, str]]:
    """Every (pid, name) an embedded farm under `home` started (its pids files)."""
    out = []
    for pid_file in [*(home / "logs").glob("*/pids"), *(home / "logs").glob("*/pids.reaped")]:
        for line in pid_file.read_text().splitlines():
            pid, name = line.split(" ", 1)
            out.append((int(pid), name))
    return out


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def chromium() -> str | None:
    import shutil

    return shutil.which("chromium") or shutil.which("chromium-browser")


def headless(*args: str) -> subprocess.CompletedProcess:
    """A real headless Chromium, with a profile of its own, run on `args` (flags, then the URL)."""
    exe = chromium()
    assert exe, "chromium is not installed: `make test` installs it (apt-get install chromium)"
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=120)


def screenshot(page: Path, png: Path, width: int = 1400, height: int = 6000) -> None:
    """Render `page` in a real headless Chromium with every network lookup refused."""
    proc = headless("--disable-quic", "--host-resolver-rules=MAP * ~NOTFOUND",
                    f"--window-size={width},{height}", f"--screenshot={png}",
                    page.resolve().as_uri())
    assert png.is_file(), proc.stderr[-2000:]


def png_pixels(png: Path) -> list[tuple[int, int, int]]:
    """The RGB pixels of an 8-bit RGB/RGBA, non-interlaced PNG (what Chromium writes)."""
    import struct
    import zlib

    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    out = []
    for row in range(height):
        f, line = raw[row * (stride + 1)], bytearray(raw[row * (stride + 1) + 1:(row + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 0xFF
            elif f == 2:
                line[i] = (line[i] + b) & 0xFF
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        out.extend(tuple(line[i:i + 3]) for i in range(0, stride, bpp))
        prev = line
    return out


def run_farm_in(argv_prefix: list[str], args: list[str], home: Path, timeout_s: float = 1200,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`run_farm` under a command prefix (e.g. `Netns.argv`: the farm in a network namespace)."""
    full_env = {**os.environ, "FARM_HOME": str(home), **(env or {})}
    if "FARM_BROKER_URL" not in (env or {}):
        full_env.pop("FARM_BROKER_URL", None)
    return subprocess.run([*argv_prefix, sys.executable, "-m", "farm", *args],
                          capture_output=True, text=True, timeout=timeout_s, env=full_env)


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def netns_unavailable(prefix: str) -> str | None:
    """Why this machine cannot make network namespaces (a real attempt), or None when it can."""
    import shutil

    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) on PATH"
    probe = f"{prefix}probe"
    made = _ip("netns", "add", probe)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    up = _ip("-n", probe, "link", "set", "lo", "up")
    _ip("netns", "delete", probe)
    return None if up.returncode == 0 else f"no loopback in a new namespace: {up.stderr.strip()}"


class Netns:
    """Network namespaces a test makes for itself (as root), named `<prefix><name>`, joined by
    veth pairs made directly inside them: nothing touches the host's own interfaces or routes.
    `close` ends every process still in them (by PID) and deletes them."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.names: list[str] = []

    def _run(self, *args: str) -> None:
        proc = _ip(*args)
        if proc.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")

    def add(self, name: str) -> str:
        full = f"{self.prefix}{name}"
        self._run("netns", "add", full)
        self.names.append(full)
        self._run("-n", full, "link", "set", "lo", "up")
        return full

    def link(self, a: str, addr_a: str, b: str, addr_b: str) -> None:
        """A veth pair between namespaces a and b ("to-<b>" in a, "to-<a>" in b), with the
        addresses (CIDR) given, both ends up."""
        na, nb = f"{self.prefix}{a}", f"{self.prefix}{b}"
        self._run("link", "add", f"to-{b}", "netns", na, "type", "veth",
                  "peer", "name", f"to-{a}", "netns", nb)
        for ns, dev, addr in ((na, f"to-{b}", addr_a), (nb, f"to-{a}", addr_b)):
            self._run("-n", ns, "addr", "add", addr, "dev", dev)
            self._run("-n", ns, "link", "set", dev, "up")

    def hosts(self, name: str, entries: dict[str, str]) -> None:
        """Names (name -> address) that commands run in namespace `name` resolve: `ip netns
        exec` mounts /etc/netns/<namespace>/hosts over /etc/hosts for them alone."""
        folder = Path("/etc/netns") / f"{self.prefix}{name}"
        folder.mkdir(parents=True, exist_ok=True)
        lines = ["127.0.0.1 localhost", "::1 localhost"]
        lines += [f"{addr} {host}" for host, addr in entries.items()]
        (folder / "hosts").write_text("\n".join(lines) + "\n")

    def argv(self, name: str) -> list[str]:
        """The prefix that runs a command inside namespace `name`."""
        return ["ip", "netns", "exec", f"{self.prefix}{name}"]

    def pids(self, full: str) -> list[int]:
        out = _ip("netns", "pids", full).stdout.split()
        return [int(p) for p in out if p.isdigit()]

    def close(self) -> None:
        import shutil
        import signal
        import time

        for full in self.names:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                pids = self.pids(full)
                for pid in pids:
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
                deadline = time.monotonic() + 5
                while pids and time.monotonic() < deadline:
                    pids = [p for p in pids if alive(p)]
                    time.sleep(0.1)
            _ip("netns", "delete", full)
            shutil.rmtree(Path("/etc/netns") / full, ignore_errors=True)
        self.names.clear()
        with contextlib.suppress(OSError):
            Path("/etc/netns").rmdir()  # when no other namespace has a folder there


def browser_dom(url: str, budget_ms: int = 15000, png: Path | None = None) -> str:
    """The DOM of `url` after its scripts ran (`budget_ms` of virtual time) in a real headless
    Chromium: what a person sees on a page that fills itself in with JavaScript. With `png`,
    a screenshot of the page as it is then, too."""
    shots = [["--dump-dom"], *([["--window-size=1400,900", f"--screenshot={png}"]] if png else [])]
    outputs = []
    for what in shots:
        proc = headless(f"--virtual-time-budget={budget_ms}", *what, url)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outputs.append(proc.stdout)
    assert png is None or png.is_file(), "Chromium wrote no screenshot"
    return outputs[0]


@contextlib.contextmanager
def redis_and_tracker(folder: Path) -> Iterator[tuple[object, str, str]]:
    """A lab farm's shared parts on loopback, stopped after the block: its own Redis and a
    tracker. Yields (their ServiceGroup, the broker URL, the tracker's address)."""
    from farm.local import services

    group = services.ServiceGroup()
    try:
        svc, broker = services.start_redis(folder / "redis", folder)
        group.add(svc)
        svc, tracker = services.start_tracker(folder)
        group.add(svc)
        yield group, broker, tracker
    finally:
        group.stop()


def crash_a_session(remote: Any, folder: Path, target: Any = "llvm",
                    fcompile: Any = None) -> None:
    """Run a kernel that reads 4 GB out of bounds in a session on a phone (`remote`): its
    session's process dies (a segfault); asserts TVM says so. The phone itself should live."""
    import numpy as np
    import pytest
    import tvm
    from tvm import te

    x = te.placeholder((4,), name="x")
    y = te.compute((4,), lambda i: x[i + 1_000_000_000] * 2.0, name="y")
    lib = folder / "crash.so"
    tvm.compile(te.create_prim_func([x, y]), target=target).export_library(str(lib),
                                                                         fcompile=fcompile)
    remote.upload(str(lib))
    crash = remote.load_module("crash.so")["main"]
    dev = remote.cpu(0)
    a = tvm.runtime.tensor(np.ones(4, "float32"), dev)
    b = tvm.runtime.tensor(np.zeros(4, "float32"), dev)
    with pytest.raises(Exception):  # noqa: B017 - the session's process died: TVM's error
        crash(a, b)


def tidy_meta_schedule_loggers() -> None:
    """MetaSchedule's loggers keep what an earlier test's in-process tune_tir left on them
    (the tests pass in any order: this runs before each module's fixtures, each test and
    each tune_tir a test runs itself):
    - pytest hangs nameless capture handlers on loggers; tune_tir copies the names of the
      handlers into a logging config and fails on a nameless one;
    - tune_tir adds file handlers in its work directory, which opens its file at the first
      record: once that directory is gone (a test's temporary one), the next record logged
      there (XGB's training, by a later test) fails with "No such file or directory"."""
    import logging

    ms_log = logging.getLogger("tvm.s_tir.meta_schedule")
    for handler in [h for h in ms_log.handlers if h.get_name() is None]:
        ms_log.removeHandler(handler)
    names = [n for n in logging.root.manager.loggerDict if n.startswith(ms_log.name)]
    for logger in [ms_log, *(logging.getLogger(n) for n in names)]:
        for handler in list(logger.handlers):
            if (isinstance(handler, logging.FileHandler)
                    and not Path(handler.baseFilename).parent.is_dir()):
                logger.removeHandler(handler)
                handler.close()


def logs_tail(home: Path, chars: int = 1500) -> dict[str, str]:
    """The end of every log an embedded farm under `home` wrote: what a failed assertion shows."""
    return {str(log.relative_to(home)): log.read_text(errors="replace")[-chars:]
            for log in sorted((home / "logs").glob("*/*.log"))}
