"""A `farm submit` killed outright (SIGKILL) cannot stop its embedded services; the next
embedded farm on the same FARM_HOME stops whatever of them is still running."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from farm.local.embedded import reap_orphans

pytestmark = pytest.mark.integration

LAUNCHER = r"""
import sys, time
from pathlib import Path
from farm.local import services
home = Path(sys.argv[1])
log_dir = home / "logs" / str(__import__("os").getpid())
group = services.ServiceGroup(pid_file=log_dir / "pids")
log_dir.mkdir(parents=True)
t, addr = services.start_tracker(log_dir)
group.add(t)
group.add(services.start_phone(addr, "k", 0, log_dir))
print("ready", flush=True)
time.sleep(600)
"""


def members(pgids: set[int]) -> list[int]:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) in pgids and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return out


def test_a_killed_runs_services_are_reaped(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(3)
    pid_file = next((tmp_path / "logs").glob("*/pids"))
    pgids = {int(line.split()[0]) for line in pid_file.read_text().splitlines()}
    proc.kill()  # SIGKILL: no teardown runs
    proc.wait()
    time.sleep(2)
    try:
        reap_orphans(tmp_path)
        deadline = time.monotonic() + 10
        while members(pgids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert members(pgids) == []
    finally:
        for pid in members(pgids):
            os.kill(pid, 9)
