"""How a worker host starts: before its phones (a reboot, a USB reset, a lab powering up) it
waits for them and says so; on a machine that shares its host name with another (cloned
disks, `compose --scale`) it is a host of its own."""

from __future__ import annotations

import time

import pytest

from farm.local import services
from farm.store import open_store
from tests.helpers import redis_and_tracker

pytestmark = pytest.mark.integration


def test_a_worker_started_before_its_phones_waits_for_them(tmp_path):
    with redis_and_tracker(tmp_path) as (group, broker, tracker):
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


def test_two_workers_of_one_host_name_are_two_hosts_with_one_leader(tmp_path):
    import socket

    import redis

    from farm.core import keys

    with redis_and_tracker(tmp_path) as (group, broker, tracker):
        group.add(services.start_phone(tracker, "k", 0, tmp_path))
        workers = [group.add(services.start_worker(tracker, broker, tmp_path, name=f"w{i}"))
                   for i in range(2)]
        store = open_store(broker)
        deadline = time.monotonic() + 180
        try:
            while len(store.hosts()) < 2:
                assert all(w.alive() for w in workers), [w.log_tail(20) for w in workers]
                assert time.monotonic() < deadline, [w.log_tail(20) for w in workers]
                time.sleep(0.5)
            names = sorted(h.name for h in store.hosts())
            assert len(set(names)) == 2, names
            assert all(n.startswith(f"farm@{socket.gethostname()}-") for n in names), names
            r = redis.Redis.from_url(broker, decode_responses=True)
            while r.get(keys.supervisor()) is None:  # the first sweep takes the lead
                assert time.monotonic() < deadline, [w.log_tail(20) for w in workers]
                time.sleep(0.5)
            leader = r.get(keys.supervisor())
            assert leader in names, (leader, names)  # one of the two, not a merged third
            # a name given twice is refused, with why
            again = services.start_worker(tracker, broker, tmp_path, name="w-again",
                                          extra=["--hostname", names[0]])
            assert again.popen.wait(timeout=120) != 0
            assert "a live worker host already has this name" in again.log_tail(20)
        finally:
            store.close()
