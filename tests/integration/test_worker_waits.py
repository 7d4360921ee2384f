"""A worker host started before its phones (a reboot, a USB reset, a lab powering up): it waits
for them and says so, then serves the key they registered under."""

from __future__ import annotations

import time

import pytest

from farm.local import services
from farm.store import open_store

pytestmark = pytest.mark.integration


def test_a_worker_started_before_its_phones_waits_for_them(tmp_path):
    group = services.ServiceGroup()
    try:
        svc, broker = services.start_redis(tmp_path / "redis", tmp_path)
        group.add(svc)
        svc, tracker = services.start_tracker(tmp_path)
        group.add(svc)
        worker = group.add(services.start_worker(tracker, broker, tmp_path))
        deadline = time.monotonic() + 120
        while "waiting for phones" not in worker.log_tail(50):
            assert worker.alive(), worker.log_tail(30)  # it used to exit: "no phones registered"
            assert time.monotonic() < deadline, worker.log_tail(30)
            time.sleep(0.5)
        group.add(services.start_phone(tracker, "late-key", 0, tmp_path))
        store = open_store(broker)
        try:
            while not any("late-key" in h.phones for h in store.hosts()):
                assert worker.alive(), worker.log_tail(30)
                assert time.monotonic() < deadline, worker.log_tail(30)
                time.sleep(0.5)
        finally:
            store.close()
        assert "phones registered at tracker" in worker.log_tail(200)
    finally:
        group.stop()
