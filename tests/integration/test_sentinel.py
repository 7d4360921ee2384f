"""Redis that survives its machine: a primary, a replica and three sentinels on loopback, a
lab worker and a job on `sentinel://`; the primary is killed mid-job (SIGKILL): Sentinel
promotes the replica, every client follows it, the job finishes, and no record a round was
told is stored is lost (a commit waits for the replica: WAIT), no candidate measured twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from farm.core import keys
from farm.devices.tracker import wait_for_phones
from farm.local import services
from farm.store import open_store

pytestmark = [pytest.mark.integration, pytest.mark.faults]

PASSWORD = "s3ntinel-test"
MASTER = "farm"
# a round a task: the primary dies once the first round's records are in, with the others to go
TRIALS = 4


def redis_node(folder: Path, port: int, replica_of: int | None = None) -> services.Service:
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
            "--appendonly", "yes", "--save", "", "--requirepass", PASSWORD,
            "--masterauth", PASSWORD]
    if replica_of:
        args += ["--replicaof", "127.0.0.1", str(replica_of)]
    folder.mkdir(parents=True, exist_ok=True)
    svc = services.start(f"redis-{port}", args, folder)
    services.wait_port("127.0.0.1", port, 30, svc)
    return svc


def sentinel(folder: Path, port: int, primary: int) -> services.Service:
    folder.mkdir(parents=True, exist_ok=True)
    conf = folder / "sentinel.conf"  # Sentinel rewrites it: its own, writable
    conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {folder}\nrequirepass {PASSWORD}\n"
                    f"sentinel monitor {MASTER} 127.0.0.1 {primary} 2\n"
                    f"sentinel auth-pass {MASTER} {PASSWORD}\n"
                    f"sentinel down-after-milliseconds {MASTER} 1000\n"
                    f"sentinel failover-timeout {MASTER} 5000\n")
    svc = services.start(f"sentinel-{port}", ["redis-server", str(conf), "--sentinel"], folder)
    services.wait_port("127.0.0.1", port, 30, svc)
    return svc


def primary_port(sentinel_port: int) -> int:
    s = redis.Redis(port=sentinel_port, password=PASSWORD, decode_responses=True)
    return int(s.sentinel_get_master_addr_by_name(MASTER)[1])


@pytest.fixture(scope="module")
def sentinel_lab(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("sentinel")
    group = services.ServiceGroup()
    try:
        p, r = services.free_port(), services.free_port()
        nodes = {p: group.add(redis_node(root / "primary", p))}
        nodes[r] = group.add(redis_node(root / "replica", r, replica_of=p))
        replica = redis.Redis(port=r, password=PASSWORD)
        deadline = time.monotonic() + 30
        while replica.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica never synced"
            time.sleep(0.2)
        ports = [services.free_port() for _ in range(3)]
        for i, port in enumerate(ports):
            group.add(sentinel(root / f"sentinel-{i}", port, p))
        url = (f"sentinel://:{PASSWORD}@" + ",".join(f"127.0.0.1:{s}" for s in ports)
               + f"/0?master={MASTER}")
        tracker_svc, tracker = services.start_tracker(root / "logs")
        group.add(tracker_svc)
        for i in range(2):
            group.add(services.start_phone(tracker, "cpu-local", i, root / "logs"))
        wait_for_phones(tracker, "cpu-local", 2, timeout_s=60)
        env = {"FARM_HOST_TTL_S": "6", "FARM_SUPERVISOR_INTERVAL_S": "2",
               "FARM_ROUND_TRIALS": str(TRIALS), "FARM_SEARCH_POPULATION": "64"}
        worker = group.add(services.start_worker(tracker, url, root / "logs", name="worker",
                                                 env=env))
        store = open_store(url)
        deadline = time.monotonic() + 120
        while not store.hosts():
            assert worker.alive(), worker.log_tail(30)
            assert time.monotonic() < deadline, "the worker never beat"
            time.sleep(0.5)
        store.close()
        yield {"url": url, "nodes": nodes, "primary": p, "replica": r, "sentinels": ports,
               "root": root, "worker": worker, "env": env}
    finally:
        group.stop()


def test_a_job_survives_the_primary_killed_mid_job(sentinel_lab, example_models: Path):
    lab = sentinel_lab
    url, out = lab["url"], lab["root"] / "out"
    env = {**os.environ, "FARM_BROKER_URL": url, "FARM_HOME": str(lab["root"] / "home"),
           **lab["env"]}
    job = subprocess.Popen([sys.executable, "-m", "farm", "submit",
                            str(example_models / "mobile.pt2"), "--trials-per-task", str(TRIALS),
                            "--out", str(out), "--timeout", "900"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    primary = redis.Redis(port=lab["primary"], password=PASSWORD, decode_responses=True)
    deadline = time.monotonic() + 600
    while True:  # some records committed, the job not over: the primary dies
        measured = sum(primary.hlen(k) for k in primary.scan_iter(match="tunefarm:wl:*:records"))
        if measured >= TRIALS:
            break
        assert job.poll() is None, job.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "nothing measured"
        time.sleep(0.2)
    before = {k: set(primary.hkeys(k)) for k in primary.scan_iter(match="tunefarm:wl:*:records")}
    lab["nodes"][lab["primary"]].signal(signal.SIGKILL)
    stdout, stderr = job.communicate(timeout=900)
    assert job.returncode == 0, stderr[-4000:]
    assert primary_port(lab["sentinels"][0]) == lab["replica"]  # promoted
    now = redis.Redis(port=lab["replica"], password=PASSWORD, decode_responses=True)
    for key, cands in before.items():  # every record stored before the kill is still there
        assert cands <= set(now.hkeys(key)), key
    summary = json.loads((out / "summary.json").read_text())
    assert all(t["trials_measured"] + t["trials_from_store"] >= TRIALS or t["single_schedule"]
               for t in summary["tasks"]), summary["tasks"]
    counts = now.hgetall(keys.job_counts(summary["job_id"]))
    assert sum(int(v) for f, v in counts.items() if f.endswith("|duplicates")) == 0, counts
    assert summary["numerics_ok"] is True
