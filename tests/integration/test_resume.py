"""Stop the submitting client half-way, submit the same model again and stop that too, then
`farm resume JOB`: each run continues from the store, no candidate is measured twice, and the
final log holds the best of all records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from farm.local import services
from farm.store import open_store
from tests.helpers import alive, ctrl_c_works, run_farm, started_pids

pytestmark = pytest.mark.integration


def measured_so_far(home: Path) -> int:
    import redis

    try:
        url = json.loads((home / "running.json").read_text())["broker_url"]
    except (OSError, ValueError, KeyError):  # the farm is not up yet (or has stopped)
        return 0
    store = open_store(url)
    try:
        return sum(store.record_count(wk) for wk in store.workload_keys())
    except redis.RedisError:  # its Redis is starting or stopping
        return 0
    finally:
        store.close()


def interrupt_after(args: list[str], home: Path, records: int) -> str:
    """Run `farm ARGS`, Ctrl-C it once the store holds `records` records; its stderr."""
    # phones that take 0.3 s more a measurement: the job is still running when it is stopped
    env = {**os.environ, "FARM_HOME": str(home), "FARM_PHONE_DELAY_S": "0.3"}
    env.pop("FARM_BROKER_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "farm", *args], env=env,
                            preexec_fn=ctrl_c_works,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None \
                and measured_so_far(home) < records:
            time.sleep(0.3)
        assert proc.poll() is None, "the job ended before the interruption"
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the farm stops, the records stay
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert [p for p in started_pids(home) if alive(p[0])] == []
    return err


def mlp(path: Path) -> Path:
    """Three dense layers: three tuning tasks, small enough to tune in seconds."""
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.ReLU(), torch.nn.Linear(48, 32),
                              torch.nn.ReLU(), torch.nn.Linear(32, 10)).eval()
    torch.export.save(torch.export.export(net, (torch.randn(4, 64),)), path)
    return path


def test_interrupted_jobs_resume_from_the_store(tmp_path):
    home = tmp_path / "home"
    model = mlp(tmp_path / "mlp.pt2")
    args = ["submit", str(model), "--trials-per-task", "8", "--round-trials", "4"]
    interrupt_after([*args, "--out", str(tmp_path / "first")], home, 4)
    assert not (tmp_path / "first").exists()  # nothing half-written
    before = measured_so_far_offline(home, tmp_path)
    # submitting again is a new job, with a job budget, that starts from the store; stop it too
    err = interrupt_after([*args, "--trials", "20", "--out", str(tmp_path / "second")], home,
                          before + 3)
    job_id = err.split("plan: job ")[1].split()[0]
    again = run_farm(["resume", job_id], home)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"job {job_id} resumed (run 2)" in again.stderr
    summary = json.loads((tmp_path / "second" / "summary.json").read_text())  # its own --out
    assert summary["job_id"] == job_id and summary["run"] == 1
    assert sum(t["trials_from_store"] for t in summary["tasks"]) >= before + 3
    assert all(t["state"] in ("done", "exhausted") for t in summary["tasks"])
    assert summary["numerics_ok"]
    # the store counted every measurement of both runs: none was of a stored candidate
    assert summary["measurements"]["duplicates"] == 0, summary["measurements"]
    assert summary["measurements"]["new"] >= 3, summary["measurements"]

    svc, url = services.start_redis(home / "redis", tmp_path / "logs")  # read the store
    try:
        store = open_store(url)
        for t in summary["tasks"]:
            records = store.records(t["workload_key"])
            assert t["trials_from_store"] + t["trials_measured"] == len(records)
            valid = [r.run_us for r in records if r.valid]
            assert t["best_us"] == pytest.approx(min(valid), rel=1e-3, abs=1e-3)  # best of all
    finally:
        svc.stop()


def measured_so_far_offline(home: Path, tmp_path: Path) -> int:
    svc, url = services.start_redis(home / "redis", tmp_path / "logs-count")
    try:
        store = open_store(url)
        return sum(store.record_count(wk) for wk in store.workload_keys())
    finally:
        svc.stop()
