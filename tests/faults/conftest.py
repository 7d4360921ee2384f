"""Shared parts of the fault-injection suite: small lab farms, and checks on the store.

A farm is shared by the tests of one module (`farm1`); a test that breaks a part of it
(a phone, the worker, Redis) puts it back with `heal` before it ends. Each test tunes its
own model (`tiny_model(path, width)` with a width of its own), so that no test finds
another's records in the store.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from farm.devices.tracker import wait_for_phones
from farm.local import services
from farm.store import open_store
from tests.helpers import run_farm

# short phone timeouts and rounds; the broker's visibility timeout is the default (1800 s): a
# lost round must come back through the supervisor. The host TTL (a dead round's lease, and
# the supervisor's grace before it sends a round again) and the supervisor's sweep are short,
# as on the other test farms (the default TTL, 30 s, made each lost round wait 30-60 s)
FAULT_ENV = {"FARM_RUN_TIMEOUT_S": "6", "FARM_ROUND_TRIALS": "4", "FARM_HOST_TTL_S": "6",
             "FARM_SUPERVISOR_INTERVAL_S": "2"}


def tiny_model(path: Path, width: int = 64, layers: int = 2) -> Path:
    """Dense layers (a tuning task each); `width` makes its workloads its own."""
    import torch

    torch.manual_seed(width)
    parts: list[torch.nn.Module] = [torch.nn.Linear(width, 32), torch.nn.ReLU()]
    if layers > 1:
        parts.append(torch.nn.Linear(32, 8))
    net = torch.nn.Sequential(*parts).eval()
    torch.export.save(torch.export.export(net, (torch.randn(8, width),)), path)
    return path


def wait_until(what: str, check: Callable[[], Any], timeout_s: float = 300,
               every_s: float = 0.5) -> Any:
    """Poll `check` until it returns something true; fail naming `what` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every_s)
    raise AssertionError(f"not within {timeout_s:.0f} s: {what}")


class Farm:
    """A lab farm on loopback: its own Redis (AOF), and per host a tracker, phones and a worker."""

    def __init__(self, root: Path, hosts: int = 1, phones: int = 2,
                 env: dict[str, str] | None = None, key: str = "cpu-local") -> None:
        self.root = root
        self.key = key  # the phones' device key (its profile: FARM_CONFIG in `env`)
        self.logs = root / "logs"
        self.group = services.ServiceGroup()
        self.port = services.free_port()
        self.redis_dir = root / "redis"
        self.extra_env = {**FAULT_ENV, **(env or {})}
        self.redis_svc, self.redis = services.start_redis(self.redis_dir, self.logs,
                                                          port=self.port)
        self.group.add(self.redis_svc)
        self.trackers: list[str] = []
        self.phones: list[list[services.Service]] = []
        self.workers: list[services.Service] = []
        for h in range(hosts):
            tsvc, tracker = services.start_tracker(self.logs)
            self.group.add(tsvc)
            self.trackers.append(tracker)
            self.phones.append([self.group.add(services.start_phone(
                tracker, key, 10 * h + i, self.logs)) for i in range(phones)])
            wait_for_phones(tracker, key, phones, timeout_s=60)
            self.workers.append(self.start_worker(h))
        self.env = {"FARM_BROKER_URL": self.redis, **self.extra_env}

    def host(self, h: int) -> str:
        return f"farm@host{h}"

    def start_worker(self, h: int) -> services.Service:
        """Start host h's worker; return once its heartbeat is in the store."""
        worker = self.group.add(services.start_worker(
            self.trackers[h], self.redis, self.logs, name=f"worker{h}-{time.monotonic_ns()}",
            env=dict(self.extra_env), extra=["--hostname", self.host(h)]))
        self.wait_for_beat(worker, self.host(h))
        return worker

    def start_helper(self, name: str = "farm@helper") -> services.Service:
        """A helper host (`farm worker --helper`); returns once its heartbeat is in the store."""
        helper = self.group.add(services.start_helper(
            self.redis, self.logs, name=f"helper-{time.monotonic_ns()}",
            extra=["--hostname", name], env=dict(self.extra_env)))
        self.wait_for_beat(helper, name)
        return helper

    def wait_for_beat(self, svc: services.Service, name: str) -> None:
        store = self.store()

        def beating() -> bool:
            assert svc.alive(), svc.log_tail(30)
            return any(b.name == name and b.pid == svc.pid for b in store.hosts())

        wait_until(f"a heartbeat of {name}", beating, timeout_s=120)
        store.close()

    @property
    def tracker(self) -> str:
        return self.trackers[0]

    @property
    def worker(self) -> services.Service:
        return self.workers[0]

    def store(self):
        return open_store(self.redis)

    def heal(self) -> None:
        """Put back what a test broke: Redis, frozen or dead phones, dead workers."""
        if not self.redis_svc.alive():
            self.redis_svc, url = services.start_redis(self.redis_dir, self.logs, port=self.port)
            self.group.add(self.redis_svc)
            assert url == self.redis
        for h, phones in enumerate(self.phones):
            for i, phone in enumerate(phones):
                phone.signal(signal.SIGCONT)
                if not phone.alive():
                    phones[i] = self.group.add(services.start_phone(
                        self.trackers[h], self.key, 10 * h + i + 100 * len(self.group.services),
                        self.logs))
            wait_for_phones(self.trackers[h], self.key, 1, timeout_s=60)
        for h, worker in enumerate(self.workers):
            if not worker.alive():
                self.workers[h] = self.start_worker(h)

    def stop(self) -> None:
        self.group.stop()


@pytest.fixture(scope="module")
def farm1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    """One host (a tracker, 2 phones, a worker) on its own Redis, for a whole module."""
    farm = Farm(tmp_path_factory.mktemp("farm1"))
    try:
        yield farm
    finally:
        farm.stop()


@pytest.fixture
def healthy(farm1: Farm) -> Iterator[Farm]:
    """`farm1`, put back together after the test, whatever it broke."""
    yield farm1
    farm1.heal()


def phone_addr(phone: services.Service) -> str:
    """The address a phone registered at its tracker (its identity in the store)."""
    args = [str(a) for a in phone.popen.args]  # type: ignore[union-attr]
    from farm.devices.tracker import phone_address

    return phone_address("127.0.0.1", args[args.index("--port") + 1])


def submit_args(farm: Farm, model: Path, out: Path, trials: int) -> list[str]:
    return ["submit", str(model), "--trials-per-task", str(trials), "--out", str(out),
            "--tracker", farm.tracker, "--device-key", farm.key, "--timeout", "900",
            "--wait-for-devices", "120"]


def submit(farm: Farm, model: Path, out: Path, home: Path, trials: int = 8):
    return run_farm(submit_args(farm, model, out, trials), home, env=farm.env)


def start_submit(farm: Farm, model: Path, out: Path, home: Path, trials: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "farm", *submit_args(farm, model, out, trials)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "FARM_HOME": str(home), **farm.env})


def record_sets(redis_url: str) -> dict[str, set[str]]:
    """Workload key -> the candidates stored for it (what must survive a fault)."""
    store = open_store(redis_url)
    try:
        return {wk: {r.candidate for r in store.records(wk)} for wk in store.workload_keys()}
    finally:
        store.close()


def total(records: dict[str, set[str]]) -> int:
    return sum(len(c) for c in records.values())


def job_counts(redis_url: str, job_id: str) -> dict[str, dict[str, int]]:
    store = open_store(redis_url)
    try:
        return store.job_counts(job_id)
    finally:
        store.close()


def check_store(farm: Farm, summary: dict) -> None:
    """What every fault must leave true: no candidate measured twice (the store's own count of
    measurements), no lost phone stored as a failed kernel, a best record per task."""
    counts = summary["measurements"]
    assert counts["duplicates"] == 0, f"measured twice: {summary['tasks']}"
    assert counts["measurements"] >= counts["new"] >= 1, counts
    store = farm.store()
    culprits = sum(1 for t in summary["tasks"] for r in store.records(t["workload_key"])
                   if r.error_class == "culprit" and r.job_id == summary["job_id"])
    # a culprit is a lost phone that is stored: counted as device_lost and as a new record
    assert counts["measurements"] == (counts["new"] + counts["duplicates"]
                                      + counts["device_lost"] - culprits), counts
    for t in summary["tasks"]:
        records = store.records(t["workload_key"])
        lost = [r for r in records if r.error_class == "device_lost"]
        assert not lost, "a lost phone was recorded as a failed kernel"
        assert t["best_us"] is not None


def run_through_fault(farm: Farm, tmp_path: Path, inject: Callable[[], Any], trials: int = 12,
                      width: int = 64) -> dict:
    """Submit a job, call `inject()` once its first records exist, let the job finish; check
    that it completed, that every record measured before the fault is still there and
    `check_store`. Returns the summary."""
    model = tiny_model(tmp_path / "tiny.pt2", width)
    out = tmp_path / "out"
    stored = total(record_sets(farm.redis))  # other tests' records, on a shared farm
    proc = start_submit(farm, model, out, tmp_path / "home", trials=trials)
    try:
        wait_until("a first record of this job",
                   lambda: total(record_sets(farm.redis)) > stored)
        before = inject() or record_sets(farm.redis)
        _, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:] + farm.worker.log_tail(40)
    after = record_sets(farm.redis)
    for k, cands in before.items():
        assert cands <= after[k], "a record measured before the fault was lost"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["numerics_ok"]
    check_store(farm, summary)
    return summary


def flush(redis_url: str) -> None:
    redis.Redis.from_url(redis_url).flushdb()
