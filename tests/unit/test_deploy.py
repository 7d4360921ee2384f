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
    env = {**os.environ, "FARM_REDIS_PASSWORD": "pw", "FARM_FLOWER_AUTH": "a:b",
           "FARM_GRAFANA_PASSWORD": "g"}
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


def dashboard() -> dict:
    import json

    return json.loads((ROOT / "deploy" / "grafana" / "tunefarm.json").read_text())


def queries(board: dict) -> list[str]:
    return [t["expr"] for p in board["panels"] for t in p.get("targets", [])]


def served_names() -> set[str]:
    """Every sample name a worker's /metrics has: the farm's series (a counter's with _total,
    a histogram's _bucket, _sum and _count) and the process's own."""
    from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector

    from workers.host.metrics import FARM_WIDE, PER_HOST
    from workers.host.round_times import HISTOGRAMS

    names = set(FARM_WIDE) | set(PER_HOST)
    names |= {f"{n}_total" for n in names} | {f"{h}_{s}" for h in HISTOGRAMS
                                               for s in ("bucket", "sum", "count")}
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return names | {s.name for family in registry.collect() for s in family.samples}


def aggregations(expr: str) -> list[tuple[str, int, int]]:
    """(operator, start, end) of each aggregation of `expr`: its argument is expr[start:end]."""
    import re

    out = []
    for m in re.finditer(r"\b(sum|max|min|avg|count)\s*(?:(?:by|without)\s*\([^)]*\)\s*)?\(",
                         expr):
        depth, i = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(expr[i], 0)
            i += 1
        out.append((m.group(1), m.end(), i - 1))
    return out


def test_the_dashboard_asks_only_for_metrics_a_worker_serves():
    """Every metric deploy/grafana/tunefarm.json queries is one a worker serves, and the
    scrape config and compose agree on the worker's port."""
    import re

    import yaml

    exprs = queries(dashboard())
    asked = {m for e in exprs for m in re.findall(r"\b(?:tunefarm|process|python)_\w+", e)}
    served = served_names()
    assert asked and asked <= served, asked - served
    assert {"tunefarm_best_latency_seconds", "tunefarm_round_duration_seconds_bucket",
            "tunefarm_round_measure_seconds_sum", "tunefarm_round_queue_wait_seconds_bucket",
            "process_cpu_seconds_total"} <= asked
    scrape = (ROOT / "deploy" / "prometheus.yml").read_text()
    compose = (ROOT / "docker-compose.yml").read_text()
    assert "worker:9464" in scrape and '"--metrics-port", "9464"' in compose
    jobs = {j["job_name"]: j for j in yaml.safe_load(scrape)["scrape_configs"]}
    assert jobs["flower"]["static_configs"][0]["targets"] == ["flower:5555"]  # Flower's own
    assert '"--port", "5555"' in compose


def test_the_dashboard_never_sums_a_farm_wide_series():
    """A farm-wide series is served by the leading host only, and for a scrape during a
    handover by two: the dashboard takes its max (or min) over instances, never a sum. The
    per-host ones are summed, by host or over hosts; `job` is Prometheus's scrape job, the
    farm's is `job_id`."""
    import re

    from workers.host.metrics import FARM_WIDE, PER_HOST

    assert not set(FARM_WIDE) & set(PER_HOST)
    for expr in queries(dashboard()):
        spans = aggregations(expr)
        for m in re.finditer(r"\btunefarm_\w+", expr):
            base = re.sub(r"_(total|bucket|sum|count)$", "", m.group())
            assert base in FARM_WIDE or base in PER_HOST, (base, expr)
            around = [(op, a, b) for op, a, b in spans if a <= m.start() < b]
            assert around, f"{m.group()} is not aggregated: {expr}"
            innermost = max(around, key=lambda span: span[1])[0]
            if base in FARM_WIDE:
                assert innermost in ("max", "min"), f"{m.group()}: {innermost} in {expr}"
        assert not re.search(r"\bjob\b", expr), expr


def test_the_dashboard_has_its_variables_and_units():
    """Variables host, device key and job id, each used by the panels; a live best-latency
    panel; durations in seconds (metric names end in _seconds, panels in unit s)."""
    import re

    from workers.host.metrics import FARM_WIDE, PER_HOST

    board = dashboard()
    names = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "host", "device_key", "job_id"} <= names
    text = " ".join(queries(board))
    for name in ("host", "device_key", "job_id"):
        assert f'{name}=~"${name}"' in text, name
    best = [p for p in board["panels"] if "tunefarm_best_latency_seconds" in
            " ".join(t["expr"] for t in p.get("targets", []))]
    assert best and best[0]["fieldConfig"]["defaults"]["unit"] == "s"
    assert board["refresh"] in ("5s", "10s", "15s")
    for name in (*FARM_WIDE, *PER_HOST):
        assert not re.search(r"_(us|ms|s|secs|duration|wall|wait)$", name), name


def test_compose_serves_a_provisioned_grafana_on_loopback():
    """Grafana in compose: bound to 127.0.0.1 like every published port, its admin password
    from the environment, its datasource the compose Prometheus and its dashboard the file."""
    import yaml

    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name, service in spec["services"].items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
    grafana = spec["services"]["grafana"]
    assert grafana["ports"] == ["127.0.0.1:3000:3000"]
    assert "FARM_GRAFANA_PASSWORD" in grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"])
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    grafana_dir = ROOT / "deploy" / "grafana" / "provisioning"
    source = yaml.safe_load((grafana_dir / "datasources" / "prometheus.yml").read_text())
    assert [d["url"] for d in source["datasources"]] == ["http://prometheus:9090"]
    assert "prometheus" in spec["services"] and "9090:9090" in spec["services"]["prometheus"]["ports"][0]
    boards = yaml.safe_load((grafana_dir / "dashboards" / "tunefarm.yml").read_text())
    folder = boards["providers"][0]["options"]["path"]
    assert mounts["./deploy/grafana/tunefarm.json"] == f"{folder}/tunefarm.json"
    assert grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] == \
        f"{folder}/tunefarm.json"


def test_flower_takes_its_own_basic_auth_variable_beside_the_farms(tmp_path, monkeypatch):
    """`farm flower` and `farm up`: $FARM_FLOWER_AUTH, else Flower's own $FLOWER_BASIC_AUTH,
    which reaches Flower in its environment (never a command line); the model reader drops it."""
    from farm.client.cmd_lab import flower_command
    from farm.core.config import load_config
    from farm.core.secrets import flower_auth
    from farm.pipeline.reader import child_env

    assert flower_auth({"FLOWER_BASIC_AUTH": "ops:pw"}) == "ops:pw"
    assert flower_auth({"FLOWER_BASIC_AUTH": "ops:pw", "FARM_FLOWER_AUTH": "farm:pw"}) == "farm:pw"
    assert flower_auth({}) is None
    config = load_config({}, env={"FARM_HOME": str(tmp_path), "FARM_BROKER_URL": "redis://x:1/0"})
    argv, env = flower_command(config, "0.0.0.0", 5555, flower_auth({"FLOWER_BASIC_AUTH": "a:b"}))
    assert env["FLOWER_BASIC_AUTH"] == "a:b" and "a:b" not in " ".join(argv)
    monkeypatch.setenv("FLOWER_BASIC_AUTH", "a:b")
    assert "FLOWER_BASIC_AUTH" not in child_env()
