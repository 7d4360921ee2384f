"""A store that fills up mid-job (maxmemory, noeviction): nobody can write the job's end into
it, so the waiting client says so and exits with the store's exit code within a supervisor
sweep and a host TTL, instead of polling forever."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import redis

from farm.core.errors import StoreError
from farm.devices.tracker import wait_for_phones
from farm.local import services
from farm.store import open_store

pytestmark = pytest.mark.integration


def test_a_full_store_ends_the_wait_with_its_reason(tmp_path, example_models):
    import os

    group = services.ServiceGroup()
    env = {"FARM_HOST_TTL_S": "6", "FARM_SUPERVISOR_INTERVAL_S": "2"}
    try:
        svc, url = services.start_redis(tmp_path / "redis", tmp_path, maxmemory="64mb")
        group.add(svc)
        svc, tracker = services.start_tracker(tmp_path)
        group.add(svc)
        group.add(services.start_phone(tracker, "cpu-local", 0, tmp_path,
                                       services.PhoneOptions(delay_s=0.5)))
        wait_for_phones(tracker, "cpu-local", 1, 60)
        group.add(services.start_worker(tracker, url, tmp_path, env=env))
        client = subprocess.Popen(
            [sys.executable, "-m", "farm", "submit", str(example_models / "mobile.pt2"),
             "--trials-per-task", "64", "--out", str(tmp_path / "out"),
             "--wait-for-devices", "120"],  # the worker's first heartbeat
            env={**os.environ, **env, "FARM_BROKER_URL": url, "FARM_HOME": str(tmp_path / "h")},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        store = open_store(url)
        deadline = time.monotonic() + 300
        while not any(store.task_states(j) for j in store.job_ids()):  # the job runs
            assert client.poll() is None and time.monotonic() < deadline, client.communicate()
            time.sleep(0.5)
        r = redis.Redis.from_url(url)
        for size in (100_000, 1000, 100):  # someone fills the store, to its last bytes
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                for i in range(1_000_000):
                    r.set(f"junk:{size}:{i}", b"x" * size)
        full_at = time.monotonic()
        out, err = client.communicate(timeout=120)
        took = time.monotonic() - full_at
        assert client.returncode == StoreError.exit_code, err[-2000:]
        assert "the store is full" in err and "maxmemory" in err, err[-2000:]
        assert took < 2 + 6 + 30, took  # a sweep and a TTL, and the client's own polls
    finally:
        group.stop()
