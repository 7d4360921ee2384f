"""The cores this process may really use: what the farm sizes its builds, searches and
rounds at once by.

`os.cpu_count()` is the machine's logical CPUs. A worker in a container (`docker run
--cpus=2`), a cgroup of a lab's batch system or a `taskset` gets fewer: sized by the
machine's count it would run several times more build processes and search threads than
it has cores, and time its phones' measurements on an overloaded host. The usable count
is the smallest of the CPUs the process may be scheduled on (its affinity) and its cgroup's
CPU quota (cgroup v2 `cpu.max`, or v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`), rounded
up, at least 1.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def quota_cores(root: Path = CGROUP, proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """This process's cgroup CPU quota in cores (None: no quota, or no cgroup to read)."""
    paths = _cgroup_dirs(root, proc_cgroup)
    for d in paths:  # v2: "max 100000" or "200000 100000"
        text = _read(d / "cpu.max")
        if text:
            quota, _, period = text.partition(" ")
            if quota != "max" and period:
                return _ratio(quota, period)
    for d in paths:  # v1
        quota, period = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
        if quota and period and quota != "-1":
            return _ratio(quota, period)
    return None


def usable_cores() -> int:
    """The cores this process may use: its affinity, capped by its cgroup's quota."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        n = os.cpu_count() or 1
    quota = quota_cores()
    if quota is not None:
        n = min(n, math.ceil(quota))
    return max(1, n)


def _cgroup_dirs(root: Path, proc_cgroup: Path) -> list[Path]:
    """The cgroup folders of this process to look for a quota in: its own first, then each
    parent up to the root (a limit set on a parent holds for its children)."""
    text = _read(proc_cgroup)
    rels = [line.split(":", 2)[2] for line in text.splitlines() if line.count(":") >= 2]
    out: list[Path] = []
    for rel in rels or ["/"]:
        for base in (root, root / "cpu", root / "cpu,cpuacct"):
            d = base / rel.lstrip("/")
            while True:
                if d.is_dir() and d not in out:
                    out.append(d)
                if d == base:
                    break
                d = d.parent
    return out


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = float(quota), float(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None
