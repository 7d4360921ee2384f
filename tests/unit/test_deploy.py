"""The compose file is valid and refuses to start without a Redis password and Flower auth."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def compose_cmd() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"],
                                                 capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return None


@pytest.mark.skipif(compose_cmd() is None, reason="no docker compose client on this machine")
def test_compose_config():
    cmd = [*compose_cmd(), "-f", str(ROOT / "docker-compose.yml"), "config"]
    env = {**os.environ, "FARM_REDIS_PASSWORD": "pw", "FARM_FLOWER_AUTH": "a:b"}
    ok = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    assert "requirepass" in ok.stdout and ("127.0.0.1:6379:6379" in ok.stdout.replace("'", "")
                                           or "host_ip: 127.0.0.1" in ok.stdout)
    bare = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    refused = subprocess.run(cmd, capture_output=True, text=True, env=bare)
    assert refused.returncode != 0 and "FARM_REDIS_PASSWORD" in refused.stderr


def test_deploy_files_exist_and_workers_need_no_torch():
    for name in ("Dockerfile.worker", "Dockerfile.flower", "LAB.md", "systemd/farm-worker.service",
                 "systemd/farm-tracker.service", "systemd/farm-flower.service"):
        assert (ROOT / "deploy" / name).is_file(), name
    docker = (ROOT / "deploy" / "Dockerfile.worker").read_text()
    assert "pip install --no-cache-dir ." in docker and "[torch" not in docker


def test_worker_side_imports_without_torch():
    """Worker hosts install no torch: nothing on the worker's path may import it."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "import workers.host.app, workers.round.measure, workers.host.main, workers.host.heartbeat\n"
            "import farm.client.cli, farm.pipeline.compile, farm.jobs.finalize, farm.pipeline.extract, farm.client.doctor\n")
    import sys

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_units_keep_secrets_off_command_lines_and_the_tracker_on_loopback():
    """systemd puts ExecStart's expanded words in argv, which `ps` shows to every user: the
    units pass secrets in the environment (a 0600 EnvironmentFile) instead."""
    for unit in (ROOT / "deploy" / "systemd").glob("*.service"):
        text = unit.read_text()
        start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
        for secret in ("FARM_BROKER_URL", "FARM_FLOWER_AUTH", "PASSWORD", "--broker",
                       "--basic-auth", "--requirepass", "--auth"):
            assert secret not in start, (unit.name, start)
    tracker = (ROOT / "deploy" / "systemd" / "farm-tracker.service").read_text()
    assert "Environment=FARM_TRACKER_HOST=127.0.0.1" in tracker and "0.0.0.0" not in tracker


def test_compose_keeps_secrets_off_command_lines():
    """Every `command:` of the compose file is free of the password variables (they are in
    `environment:`, which `ps` does not show)."""
    import yaml

    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name, service in spec["services"].items():
        command = " ".join(service.get("command", []))
        for secret in ("${FARM_REDIS_PASSWORD", "${FARM_FLOWER_AUTH", "--requirepass",
                       "--basic-auth", "--broker"):
            assert secret not in command, (name, command)
    assert "exec redis-server -" in " ".join(spec["services"]["redis"]["command"])


def test_the_dashboard_asks_only_for_metrics_a_worker_serves():
    """Every metric deploy/grafana/tunefarm.json queries is one workers/host/metrics.py defines."""
    import json
    import re

    board = json.loads((ROOT / "deploy" / "grafana" / "tunefarm.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    asked = {m for e in exprs for m in re.findall(r"\btunefarm_\w+", e)}
    served = set(re.findall(r'"(tunefarm_\w+)"', (ROOT / "workers" / "host" / "metrics.py").read_text()))
    served |= {f"{name}_total" for name in served}  # counters are exposed with _total
    assert asked and asked <= served, asked - served
    scrape = (ROOT / "deploy" / "prometheus.yml").read_text()
    compose = (ROOT / "docker-compose.yml").read_text()
    assert "worker:9464" in scrape and '"--metrics-port", "9464"' in compose
