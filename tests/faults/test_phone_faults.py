"""Phones that freeze or die mid-job: the job completes, and a lost phone is never recorded
as a failed kernel (README: "What happens when things fail")."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import redis

from farm import services
from farm.store import open_store
from farm.tracker import wait_for_phones
from tests.helpers import run_farm

pytestmark = [pytest.mark.integration, pytest.mark.faults]


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
def small_farm(redis_url: str, tmp_path: Path):
    """Redis (the session's), a tracker, 2 phones, 1 worker with a short run timeout."""
    redis.Redis.from_url(redis_url).flushdb()
    logs = tmp_path / "logs"
    group = services.ServiceGroup()
    try:
        tsvc, tracker = services.start_tracker(logs)
        group.add(tsvc)
        phones = [group.add(services.start_phone(tracker, "cpu-local", i, logs)) for i in range(2)]
        wait_for_phones(tracker, "cpu-local", 2, timeout_s=60)
        env = {"FARM_RUN_TIMEOUT_S": "6", "FARM_ROUND_TRIALS": "4"}
        worker = group.add(services.start_worker(tracker, redis_url, logs, env=env,
                                                 extra=["--hostname", "farm@faults"]))
        yield {"redis": redis_url, "tracker": tracker, "phones": phones, "worker": worker,
               "env": {"FARM_BROKER_URL": redis_url, **env}, "logs": logs}
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


def test_a_frozen_phone_is_device_lost_not_a_failed_kernel(small_farm, tmp_path):
    model = tiny_model(tmp_path / "tiny.pt2")
    small_farm["phones"][0].signal(signal.SIGSTOP)  # frozen: registered, never answers
    out = tmp_path / "out"
    proc = submit(small_farm, model, out, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:] + small_farm["worker"].log_tail(30)
    summary = json.loads((out / "summary.json").read_text())
    assert sum(t["device_lost"] for t in summary["tasks"]) >= 1, summary["tasks"]
    assert summary["numerics_ok"]
    check_store(small_farm, summary)


def test_a_phone_killed_mid_job(small_farm, tmp_path):
    model = tiny_model(tmp_path / "tiny.pt2")
    out = tmp_path / "out"
    r = redis.Redis.from_url(small_farm["redis"])
    import subprocess
    import sys

    env_cmd = [sys.executable, "-m", "farm.cli", "submit", str(model), "--trials-per-task", "12",
               "--out", str(out), "--tracker", small_farm["tracker"], "--timeout", "900"]
    import os

    proc = subprocess.Popen(env_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FARM_HOME": str(tmp_path / "home"),
                                 **small_farm["env"]})
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # kill a phone once the first records exist
            if any(r.hlen(k) > 0 for k in r.scan_iter(match="tunefarm:wl:*:records")):
                break
            time.sleep(0.5)
        else:
            raise AssertionError("no record was measured")
        before = {k: set(r.hkeys(k)) for k in r.scan_iter(match="tunefarm:wl:*:records")}
        small_farm["phones"][1].stop()
        _, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:] + small_farm["worker"].log_tail(30)
    after = {k: set(r.hkeys(k)) for k in r.scan_iter(match="tunefarm:wl:*:records")}
    for k, cands in before.items():
        assert cands <= after[k]  # nothing measured before the fault is lost
    summary = json.loads((out / "summary.json").read_text())
    assert summary["numerics_ok"]
    check_store(small_farm, summary)
