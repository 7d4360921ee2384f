"""The cores the farm sizes its builds, searches and rounds at once by (farm/core/cores.py):
the process's affinity and its cgroup's CPU quota, not the machine's logical CPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from farm.core.cores import quota_cores


def cgroup(root: Path, rel: str, files: dict[str, str]) -> Path:
    d = root / rel.lstrip("/")
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text + "\n")
    proc = root / "proc-self-cgroup"
    proc.write_text(f"0::{rel}\n")
    return proc


def test_cgroup_v2_quota_in_cores(tmp_path: Path) -> None:
    proc = cgroup(tmp_path, "/", {"cpu.max": "250000 100000"})  # docker run --cpus=2.5
    assert quota_cores(tmp_path, proc) == 2.5


def test_no_quota_is_none(tmp_path: Path) -> None:
    proc = cgroup(tmp_path, "/", {"cpu.max": "max 100000"})
    assert quota_cores(tmp_path, proc) is None
    assert quota_cores(tmp_path / "absent", tmp_path / "absent-cgroup") is None


def test_a_parent_cgroups_quota_holds_for_its_child(tmp_path: Path) -> None:
    cgroup(tmp_path, "/lab.slice", {"cpu.max": "100000 100000"})
    proc = cgroup(tmp_path, "/lab.slice/farm.service", {"cpu.max": "max 100000"})
    assert quota_cores(tmp_path, proc) == 1.0


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    d = tmp_path / "cpu,cpuacct" / "docker" / "abc"
    d.mkdir(parents=True)
    (d / "cpu.cfs_quota_us").write_text("300000\n")
    (d / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("4:cpu,cpuacct:/docker/abc\n")
    assert quota_cores(tmp_path, proc) == 3.0
    (d / "cpu.cfs_quota_us").write_text("-1\n")  # v1's "no quota"
    assert quota_cores(tmp_path, proc) is None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs a Linux process that may run on 2 or more CPUs")
def test_a_worker_pinned_to_one_cpu_sizes_itself_for_one() -> None:
    """What `taskset -c 0 farm worker` gets: one build process and one search thread, not
    one per CPU of the machine (which would overload the core its phones are timed on)."""
    code = ("import json, os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from farm.core.config import FarmConfig; c = FarmConfig(); "
            "print(json.dumps([c.builder_workers, c.search_threads, os.cpu_count()]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2])
    builders, threads, machine = json.loads(out.stdout)
    assert machine >= 2
    assert (builders, threads) == (1, 1)
