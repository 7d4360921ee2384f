"""Phones on another host: the farm across Linux network namespaces that the test makes.

    ph  10.213.1.1              a TVM tracker and 2 emulated phones (`farm phones`)
    wk  10.213.1.2, 10.213.2.2  `farm worker`, and the client (`farm submit`)
    rd  10.213.2.1              Redis, with a password

Each namespace has its own loopback, so a phone that gives the tracker 127.0.0.1 is out of
the worker's reach, as on a second machine. The phones register at the tracker through their
own loopback and advertise a name, `lab-phones`, that only the worker's namespace resolves
(as compose's worker resolves the service name `phones`): without `--advertise` the tracker
would hand the worker 127.0.0.1, and every candidate would end as device lost.
Only the namespaces' own addresses are used; teardown ends every process left in them (by
PID) and deletes them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from farm.local import services
from tests.helpers import Netns, netns_unavailable, run_farm_in

pytestmark = pytest.mark.integration

PHONES_IP, WORKER_IP, REDIS_IP = "10.213.1.1", "10.213.1.2", "10.213.2.1"
PHONES_NAME = "lab-phones"
TRACKER = f"{PHONES_IP}:9190"
PASSWORD = "netns-secret"
BROKER = f"redis://:{PASSWORD}@{REDIS_IP}:6379/0"
WORKER = "farm@netns-worker"
ENV = {"FARM_BROKER_URL": BROKER, "FARM_ROUND_TRIALS": "2"}


def farm_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "farm", *args]


def wait_for(what: str, check: Callable[[], bool], timeout_s: float,
             *alive: services.Service) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        for svc in alive:
            assert svc.alive(), f"{svc.name} died: {svc.log_tail(30)}"
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s:.0f} s: {what}")


def wait_ports_in(ns: Netns, name: str, *addrs: tuple[str, int]) -> None:
    """Wait until something listens at each address, seen from inside namespace `name`."""
    code = ("import sys; from farm.local.services import wait_port; "
            "[wait_port(a, int(p), 60) for a, p in zip(sys.argv[1::2], sys.argv[2::2])]")
    proc = subprocess.run([*ns.argv(name), sys.executable, "-c", code,
                           *[str(x) for addr in addrs for x in addr]],
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.fixture(scope="module")
def netlab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    prefix = f"tf{os.getpid()}"
    why = netns_unavailable(prefix)
    if why:
        pytest.skip(f"this machine cannot make network namespaces: {why}")
    root = tmp_path_factory.mktemp("netns")
    logs = root / "logs"
    env = {"FARM_HOME": str(root / "home")}
    ns = Netns(prefix)
    group = services.ServiceGroup()
    try:
        for name in ("ph", "wk", "rd"):
            ns.add(name)
        ns.link("ph", f"{PHONES_IP}/24", "wk", f"{WORKER_IP}/24")
        ns.link("rd", f"{REDIS_IP}/24", "wk", "10.213.2.2/24")
        ns.hosts("wk", {PHONES_NAME: PHONES_IP})
        data = services.private_dir(root / "redis")  # the password in a file, as start_redis
        conf = services.write_private(data / "redis.conf", f'requirepass "{PASSWORD}"\n')
        group.add(services.start("redis", [
            *ns.argv("rd"), services.redis_binary(), str(conf), "--port", "6379",
            "--bind", REDIS_IP, "--dir", str(data), *services.REDIS_DURABLE,
            "--daemonize", "no", "--protected-mode", "yes"], logs))
        # on every address of its namespace: the phones reach it on loopback, the worker on
        # 10.213.1.1
        tracker = group.add(services.start("tracker", [
            *ns.argv("ph"), *farm_argv("tracker", "--host", "0.0.0.0", "--port", "9190")], logs))
        wait_ports_in(ns, "wk", (REDIS_IP, 6379), (PHONES_IP, 9190))
        phones = group.add(services.start("phones", [
            *ns.argv("ph"), *farm_argv("phones", "--count", "2", "--key", "cpu-local",
                                       "--tracker", "127.0.0.1:9190", "--host", "0.0.0.0",
                                       "--advertise", PHONES_NAME,
                                       "--log-dir", str(logs / "phones"))], logs, env))
        wait_for("2 phones registered", lambda: "emulated phones of key" in
                 phones.log_path.read_text(errors="replace"), 90, tracker, phones)
        # one round at a time: these "remote" phones share the machine's 2 cores; the broker
        # URL (with its password) in the environment, as services.start_worker passes it
        worker = group.add(services.start("worker", [
            *ns.argv("wk"), *farm_argv("worker", "--tracker", TRACKER, "--hostname", WORKER,
                                       "--concurrency", "1")],
            logs, {**env, **ENV}))
        yield {"ns": ns, "root": root, "logs": logs, "worker": worker, "phones": phones}
    finally:
        group.stop()
        ns.close()


def tiny_model(path: Path, width: int) -> Path:
    """One Linear+ReLU: one tuning task."""
    import torch

    torch.manual_seed(width)
    net = torch.nn.Sequential(torch.nn.Linear(width, 16), torch.nn.ReLU()).eval()
    torch.export.save(torch.export.export(net, (torch.randn(4, width),)), path)
    return path


def store_hosts(ns: Netns, summary: dict) -> dict[str, list[str]]:
    """Workload key -> the worker host of each stored record (read from the worker's side)."""
    code = ("import json, sys; from farm.store import open_store; s = open_store(sys.argv[1]); "
            "print(json.dumps({wk: [r.host for r in s.records(wk)] for wk in sys.argv[2:]}))")
    out = subprocess.run([*ns.argv("wk"), sys.executable, "-c", code, BROKER,
                          *[t["workload_key"] for t in summary["tasks"]]],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def sessions_by_peer(logs: Path) -> dict[str, int]:
    """Peer address -> sessions the phones served (TVM logs "connected from ('ADDR', PORT)")."""
    counts: dict[str, int] = {}
    for log in (logs / "phones").glob("phone-*.log"):
        for peer in re.findall(r"connected from \('([^']+)'", log.read_text(errors="replace")):
            counts[peer] = counts.get(peer, 0) + 1
    return counts


def test_a_job_is_measured_on_phones_in_another_namespace(netlab, tmp_path):
    model = tiny_model(tmp_path / "tiny.pt2", width=24)
    out = tmp_path / "out"
    proc = run_farm_in(netlab["ns"].argv("wk"), [
        "submit", str(model), "--trials-per-task", "2", "--out", str(out),
        "--tracker", TRACKER, "--wait-for-devices", "120", "--timeout", "300"],
        tmp_path / "home", timeout_s=420, env=ENV)
    assert proc.returncode == 0, f"{proc.stderr[-3000:]}\nworker: {netlab['worker'].log_tail(40)}"
    summary = json.loads((out / "summary.json").read_text())
    m = summary["measurements"]
    assert m["measurements"] >= 1 and m["device_lost"] == 0 and m["duplicates"] == 0, m
    assert m["measurements"] == sum(t["trials_measured"] for t in summary["tasks"]), summary
    for t in summary["tasks"]:
        assert t["state"] == "done" and t["device_lost"] == 0 and not t["failures"], t
    # the compiled model ran on one of the phones too, found through the tracker
    assert summary["measured_on"] == f"phone of key cpu-local via {TRACKER}"
    assert summary["numerics_ok"]
    hosts = store_hosts(netlab["ns"], summary)
    assert all(hosts.values()) and set().union(*hosts.values()) == {WORKER}, hosts
    # every session the phones served came from the worker's namespace, none over loopback:
    # each measurement, and the compiled model's run
    sessions = sessions_by_peer(netlab["logs"])
    assert set(sessions) == {WORKER_IP}, sessions
    assert sessions[WORKER_IP] >= m["measurements"] + 1, (sessions, m)


@pytest.mark.parametrize("flags, says", [
    ([], "run them with --host 0.0.0.0 --advertise"),  # today's default: loopback
    (["--advertise", WORKER_IP], f"the phones listen on 127.0.0.1 only, so nothing answers "
                                 f"at {WORKER_IP}"),
])
def test_phones_no_worker_could_reach_are_refused(netlab, tmp_path, flags, says):
    """Phones in the worker's namespace on the tracker of another one: loopback phones would
    be handed to that tracker's worker as 127.0.0.1, so `farm phones` refuses to start them."""
    proc = run_farm_in(netlab["ns"].argv("wk"), [  # started phones would run until killed
        "phones", "--count", "1", "--tracker", TRACKER, "--log-dir", str(tmp_path / "logs"),
        *flags], tmp_path / "home", timeout_s=60)
    assert proc.returncode == 2, proc.stderr[-2000:]  # a usage error, named
    assert says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not list((tmp_path / "logs").glob("phone-*.log"))  # nothing was started
