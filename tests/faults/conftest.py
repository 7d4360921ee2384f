"""Shared parts of the fault-injection suite: a small lab farm and checks on the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from farm import services
from farm.store import open_store
from farm.tracker import wait_for_phones
from tests.helpers import run_farm

FAULT_ENV = {"FARM_RUN_TIMEOUT_S": "6", "FARM_ROUND_TRIALS": "4", "FARM_ROUND_TIMEOUT_S": "20"}


def tiny_model(path: Path) -> Path:
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(64, 32)

        def forward(self, x):
            return torch.relu(self.fc(x))

    torch.export.save(torch.export.export(Tiny().eval(), (torch.randn(8, 64),)), path)
    return path


@pytest.fixture
def small_farm(tmp_path: Path):
    """Its own Redis (AOF), a tracker, 2 phones, 1 worker with short timeouts."""
    logs = tmp_path / "logs"
    group = services.ServiceGroup()
    try:
        port = services.free_port()
        rsvc, redis_url = services.start_redis(tmp_path / "redis", logs, port=port)
        group.add(rsvc)
        tsvc, tracker = services.start_tracker(logs)
        group.add(tsvc)
        phones = [group.add(services.start_phone(tracker, "cpu-local", i, logs)) for i in range(2)]
        wait_for_phones(tracker, "cpu-local", 2, timeout_s=60)
        env = dict(FAULT_ENV)
        worker = group.add(services.start_worker(tracker, redis_url, logs, env=env,
                                                 extra=["--hostname", "farm@faults"]))
        yield {"redis": redis_url, "redis_svc": rsvc, "redis_port": port,
               "redis_dir": tmp_path / "redis", "tracker": tracker, "phones": phones,
               "worker": worker, "env": {"FARM_BROKER_URL": redis_url, **env}, "logs": logs,
               "group": group}
    finally:
        group.stop()


def submit(farm: dict, model: Path, out: Path, home: Path, trials: int = 8):
    return run_farm(["submit", str(model), "--trials-per-task", str(trials), "--out", str(out),
                     "--tracker", farm["tracker"], "--timeout", "900",
                     "--wait-for-devices", "120"], home, env=farm["env"])


def check_store(farm: dict, summary: dict) -> None:
    store = open_store(farm["redis"])
    for t in summary["tasks"]:
        records = store.records(t["workload_key"])
        assert len({r.candidate for r in records}) == len(records)  # nothing measured twice
        assert not [r for r in records if r.error_class is not None], \
            "a lost phone was recorded as a failed kernel"
        assert t["best_us"] is not None




def start_submit(farm: dict, model: Path, out: Path, home: Path, trials: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "farm.cli", "submit", str(model), "--trials-per-task", str(trials),
         "--out", str(out), "--tracker", farm["tracker"], "--timeout", "900",
         "--wait-for-devices", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "FARM_HOME": str(home), **farm["env"]})


def record_sets(redis_url: str) -> dict[str, set[str]]:
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    return {k: set(r.hkeys(k)) for k in r.scan_iter(match="tunefarm:wl:*:records")}


def wait_for_records(redis_url: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(record_sets(redis_url).values()):
            return
        time.sleep(0.5)
    raise AssertionError("no record was measured")


def run_through_fault(farm: dict, tmp_path: Path, inject, trials: int = 12) -> dict:
    """Submit a job, call `inject()` once its first records exist, let the job finish; check
    that it completed, that every record measured before the fault is still there, that no
    candidate was stored twice and no lost phone became a failed kernel. Returns the summary."""
    model = tiny_model(tmp_path / "tiny.pt2")
    out = tmp_path / "out"
    proc = start_submit(farm, model, out, tmp_path / "home", trials=trials)
    try:
        wait_for_records(farm["redis"])
        before = inject() or record_sets(farm["redis"])
        _, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:] + farm["worker"].log_tail(40)
    after = record_sets(farm["redis"])
    for k, cands in before.items():
        assert cands <= after[k], "a record measured before the fault was lost"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["numerics_ok"]
    check_store(farm, summary)
    return summary
