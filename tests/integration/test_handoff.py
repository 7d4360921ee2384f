"""A job's tail spreads over the hosts (workers/round/handoff.py): host A runs both rounds of a job
at once, host B starts with idle phones of the same key and an empty queue, and one of A's
rounds hands B the rest of its trials.

Real parts: a Redis, per host a TVM RPC tracker, two slow emulated phones and a gated
`farm worker`; the job is a real `farm submit` in lab mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from farm.devices.tracker import wait_for_phones
from farm.local import services
from farm.store import open_store
from tests.integration.test_lab import hosts_of_records, mlp_model

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KEY = "slowtest"
# not on the host's CPU (host_cpu false): the gate runs two rounds of the key at once from the
# start (workers/round/gate.py); a small population keeps each batch's search short
TOML = f"""[profiles.{KEY}]
target = {{ kind = "llvm" }}
host_cpu = false
min_repeat_ms = 20

[farm]
search_population = 128
"""
TRIALS = 64  # one round of 4 batches per task: room to hand off after the first
HOST_A, HOST_B = "farm@hostA", "farm@hostB"


def both_rounds_on(url: str, host: str, client: subprocess.Popen, timeout_s: float) -> None:
    """Until the host's heartbeat says it runs two rounds of KEY (its gate's held slots)."""
    store = open_store(url)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if client.poll() is not None:
                raise AssertionError(f"farm submit ended: {client.communicate()[0][-3000:]}")
            if any(h.name == host and h.rounds.get(KEY) == 2 for h in store.hosts()):
                return
            time.sleep(0.5)
        raise AssertionError(f"the job's two rounds never ran together on {host}")
    finally:
        store.close()


def start_host(group: services.ServiceGroup, name: str, logs: Path, delays: list[float]) -> str:
    svc, tracker = services.start_tracker(logs)
    group.add(svc)
    for i, d in enumerate(delays):
        group.add(services.start_phone(tracker, KEY, i, logs / name,
                                       services.PhoneOptions(delay_s=d)))
    wait_for_phones(tracker, KEY, len(delays), 60)
    return tracker


def test_an_idle_host_takes_the_rest_of_a_round(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    config = tmp_path / "farm.toml"
    config.write_text(TOML)
    env = {"FARM_CONFIG": str(config), "FARM_HOST_TTL_S": "6"}
    model = mlp_model(tmp_path / "mlp.pt2", [64, 96, 80])  # two dense layers: two workloads
    group = services.ServiceGroup()
    client = None
    try:
        redis_svc, url = services.start_redis(tmp_path / "redis", logs)
        group.add(redis_svc)
        tracker_a = start_host(group, "a", logs, [0.25, 0.25])
        tracker_b = start_host(group, "b", logs, [0.25, 0.25])  # phones idle: no worker yet
        group.add(services.start_worker(tracker_a, url, logs, name="worker-a",
                                        extra=["--hostname", HOST_A], env=env))
        out = tmp_path / "out"
        client = subprocess.Popen(
            [sys.executable, "-m", "farm", "submit", str(model), "--device-key", KEY,
             "--trials-per-task", str(TRIALS), "--round-trials", str(TRIALS), "--out", str(out),
             "--tracker", tracker_a, "--timeout", "900",
             "--wait-for-devices", "120"],  # worker A's first heartbeat may come after this
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, **env, "FARM_HOME": str(tmp_path / "home"),
                 "FARM_BROKER_URL": url})
        both_rounds_on(url, HOST_A, client, timeout_s=300)
        # the queue is empty now: without a hand-off, host B would measure nothing
        group.add(services.start_worker(tracker_b, url, logs, name="worker-b",
                                        extra=["--hostname", HOST_B], env=env))
        output, _ = client.communicate(timeout=900)
        assert client.returncode == 0, output[-3000:]
        summary = json.loads((out / "summary.json").read_text())
        hosts = hosts_of_records(url, summary)  # a fresh Redis: this job's records only
    finally:
        if client is not None and client.poll() is None:
            client.kill()
            client.wait()
        group.stop()
    log_a = (logs / "worker-a.log").read_text()
    assert "handing it the rest" in log_a, log_a[-3000:]
    # a workload measured on both hosts: A measured its first batches, B the rest
    assert any(h == {HOST_A, HOST_B} for h in hosts.values()), hosts
    # nothing lost nor measured twice: every task got its trials and ended done
    for t in summary["tasks"]:
        assert t["trials_measured"] == TRIALS, t
        assert t["state"] == "done", t
