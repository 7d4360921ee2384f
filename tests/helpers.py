"""Helpers for tests that run the real `farm` command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil


def run_farm(args: list[str], home: Path, timeout_s: float = 1200,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "FARM_HOME": str(home), **(env or {})}
    full_env.pop("FARM_BROKER_URL", None) if "FARM_BROKER_URL" not in (env or {}) else None
    return subprocess.run([sys.executable, "-m", "farm.cli", *args], capture_output=True,
                          text=True, timeout=timeout_s, env=full_env)


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
