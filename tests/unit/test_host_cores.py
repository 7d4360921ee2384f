"""A worker host short of cores says so: `farm devices` and `farm doctor` read the cores its
phones need (its heartbeat, from its rounds' CPU: workers/round/gate.py) against its own."""

from __future__ import annotations

from farm.client import doctor
from farm.store import open_store
from farm.store.hosts import HostBeat, format_hosts
from workers.round.gate import cores_needed


def test_the_cores_a_hosts_phones_need_follow_its_cpu_per_batch_and_their_speed(monkeypatch):
    monkeypatch.setattr("workers.round.gate.usable_cores", lambda: 2)
    # 2 cores: 1 s of the whole host per batch is 2 CPU s; 8 phones of 0.5 s measure a batch
    # of 16 in 1 s: 2 cores keep them busy; twice the phones need twice the cores
    assert cores_needed(1.0, 0.5, 8) == 2.0
    assert cores_needed(1.0, 0.5, 16) == 4.0
    assert cores_needed(None, 0.5, 8) is None and cores_needed(1.0, None, 8) is None


def test_devices_and_doctor_name_a_host_short_of_cores(clean_redis):
    store = open_store(clean_redis)
    beat = dict(tracker="127.0.0.1:9190", phones={"pixel": {"total": 16, "free": 0, "busy": 16}},
                beat_at=0.0)
    store.publish_host(HostBeat(name="farm@big", cores=8, cores_needed={"pixel": 3.4}, **beat),
                       ttl_s=60)
    assert "short of cores" not in format_hosts(store.hosts())
    assert doctor.check_host_cores(clean_redis).warn is False
    store.publish_host(HostBeat(name="farm@small", cores=2, cores_needed={"pixel": 3.4}, **beat),
                       ttl_s=60)
    text = format_hosts(store.hosts())
    assert "host farm@small is short of cores for its phones of pixel" in text, text
    assert "need ~3.4 cores" in text and "it has 2" in text and "idle ~41 %" in text, text
    assert "farm@big is short" not in text
    check = doctor.check_host_cores(clean_redis)
    assert check.ok and check.warn and "farm@small" in check.detail, check
    assert "--helper" in check.fix
