"""Helpers for tests that run the real `farm` command."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil


def run_farm(args: list[str], home: Path, timeout_s: float = 1200,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "FARM_HOME": str(home), **(env or {})}
    full_env.pop("FARM_BROKER_URL", None) if "FARM_BROKER_URL" not in (env or {}) else None
    return subprocess.run([sys.executable, "-m", "farm.cli", *args], capture_output=True,
                          text=True, timeout=timeout_s, env=full_env)


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


def screenshot(page: Path, png: Path, width: int = 1400, height: int = 6000) -> None:
    """Render `page` in a real headless Chromium with every network lookup refused."""
    exe = chromium()
    assert exe, "chromium is not installed: `make test` installs it (apt-get install chromium)"
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={profile}",
             "--host-resolver-rules=MAP * ~NOTFOUND", f"--window-size={width},{height}",
             f"--screenshot={png}", page.resolve().as_uri()],
            capture_output=True, text=True, timeout=120)
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
