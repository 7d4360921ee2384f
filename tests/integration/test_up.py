"""`farm up`: the lab topology as local processes (Redis with a password, Flower with basic
auth, a tracker, phones, a worker, and on request a Prometheus scraping the worker); Ctrl-C
stops all of them."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import psutil
import pytest

from farm.local.services import free_port
from tests.helpers import ctrl_c_works, run_farm

pytestmark = pytest.mark.integration


def test_farm_up_serves_a_password_protected_farm_and_stops_on_ctrl_c(tmp_path):
    redis_port, flower_port, tracker_port, prom_port = (free_port(), free_port(), free_port(),
                                                        free_port())
    env = {**os.environ, "FARM_HOME": str(tmp_path / "home"), "FARM_REDIS_PASSWORD": "s3cret",
           "FARM_FLOWER_AUTH": "admin:pw"}
    env.pop("FARM_BROKER_URL", None)
    up = subprocess.Popen([sys.executable, "-m", "farm", "up", "--redis-port", str(redis_port),
                           "--flower-port", str(flower_port), "--tracker-port", str(tracker_port),
                           "--phones", "1", "--prometheus-port", str(prom_port)], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True,
                          preexec_fn=ctrl_c_works)
    url = f"redis://:s3cret@127.0.0.1:{redis_port}/0"
    try:
        deadline = time.monotonic() + 240
        hosts = []
        while time.monotonic() < deadline and not hosts:
            assert up.poll() is None, up.communicate()[1][-2000:]
            proc = run_farm(["devices", "--json"], tmp_path, env={"FARM_BROKER_URL": url},
                            timeout_s=60)
            hosts = json.loads(proc.stdout)["hosts"] if proc.returncode == 0 else []
            time.sleep(1)
        assert hosts and hosts[0]["phones"]["cpu-local"]["total"] == 1, hosts
        assert hosts[0]["tracker"] == f"127.0.0.1:{tracker_port}"

        wrong = run_farm(["devices"], tmp_path, timeout_s=60,
                         env={"FARM_BROKER_URL": f"redis://:nope@127.0.0.1:{redis_port}/0"})
        assert wrong.returncode == 5 and "***@127.0.0.1" in wrong.stderr  # password not shown
        assert "nope" not in wrong.stderr

        req = urllib.request.Request(f"http://127.0.0.1:{flower_port}/api/workers")
        req.add_header("Authorization", "Basic " + base64.b64encode(b"admin:pw").decode())
        for _ in range(60):
            try:
                with urllib.request.urlopen(req, timeout=5) as resp:
                    assert resp.status == 200
                    break
            except OSError:
                time.sleep(1)
        else:
            raise AssertionError("Flower did not answer")
        # Prometheus scrapes the worker's /metrics: the phone shows up in its own query API
        query = (f"http://127.0.0.1:{prom_port}/api/v1/query?query="
                 + urllib.parse.quote('sum(tunefarm_phones{device_key="cpu-local"})'))
        series = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not series:
            with urllib.request.urlopen(query, timeout=10) as resp:
                series = json.loads(resp.read())["data"]["result"]
            time.sleep(1)
        assert series and float(series[0]["value"][1]) == 1, series
        # ... and Flower's /metrics (no login needed there): its own series, scraped
        query = (f"http://127.0.0.1:{prom_port}/api/v1/query?query="
                 + urllib.parse.quote('count({job="flower", __name__=~"flower_.+"})'))
        series = []
        while time.monotonic() < deadline + 60 and not series:
            with urllib.request.urlopen(query, timeout=10) as resp:
                series = json.loads(resp.read())["data"]["result"]
            time.sleep(1)
        assert series and float(series[0]["value"][1]) >= 1, series
        children = psutil.Process(up.pid).children(recursive=True)
        assert len(children) >= 6  # redis, flower, prometheus, tracker, phone, worker (and theirs)
        # no secret on a command line: anyone on the host reads /proc/PID/cmdline (`ps`)
        for child in [psutil.Process(up.pid), *children]:
            cmdline = Path(f"/proc/{child.pid}/cmdline").read_bytes().replace(b"\0", b" ")
            assert b"s3cret" not in cmdline and b"admin:pw" not in cmdline, cmdline
    finally:
        os.killpg(up.pid, signal.SIGINT)
        up.wait(timeout=120)
    time.sleep(2)
    assert [c.pid for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE] == []


@pytest.mark.parametrize("missing", ["FARM_REDIS_PASSWORD", "FARM_FLOWER_AUTH"])
def test_farm_up_on_a_lab_address_refuses_without_a_password(tmp_path, missing):
    """Non-loopback means authenticated: refused before anything starts."""
    env = {"FARM_REDIS_PASSWORD": "pw", "FARM_FLOWER_AUTH": "a:b"}
    env[missing] = ""
    proc = run_farm(["up", "--bind", "0.0.0.0", "--redis-port", str(free_port())],
                    tmp_path / "home", env=env, timeout_s=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("farm: error: farm up --bind")
    assert missing in proc.stderr
    assert not (tmp_path / "home" / "up-redis").exists()  # nothing was started
