"""Which phone measured what: the runner's session log (workers/metaschedule/phonelog.py) read back as
spans, and a job's per-phone table (farm/store/phones.py)."""

from __future__ import annotations

import json
import time

import pytest

from farm.store.phones import PhoneSpan, job_phones, tuning_wall
from workers.metaschedule.phonelog import PhoneLog


def write(path, *entries):
    with open(path, "a") as f:
        for e in entries:
            f.write(json.dumps(e) + "\n")


def test_spans_join_the_log_to_the_batch_and_a_missing_end_is_device_lost(tmp_path):
    path = tmp_path / "phones.jsonl"
    log = PhoneLog(str(path), deadline_s=6.0)
    now = time.time()
    write(path, {"sid": "1-1", "phone": "127.0.0.1:9001", "start": now - 3},
          {"sid": "2-1", "phone": "127.0.0.1:9002", "start": now - 2},
          {"sid": "1-1", "artifact": "/a/1.tar"}, {"sid": "2-1", "artifact": "/a/2.tar"},
          {"sid": "1-1", "end": now - 1},
          {"sid": "3-1", "phone": "127.0.0.1:9001", "start": now - 20},  # killed: frozen
          {"sid": "4-1", "phone": "127.0.0.1:9003", "start": now - 4},  # refused to connect
          {"sid": "4-1", "end": now - 3.5})
    got = log.spans(["/a/1.tar", None, "/a/2.tar", "/a/3.tar"],
                    ["ok", "build", "runtime", "device_lost"], key="k", worker="w", job_id="j",
                    workload_key="wk", task="t", batch="r#1")
    assert [(s.phone, s.outcome) for s in got] == [
        ("127.0.0.1:9001", "device_lost"), ("127.0.0.1:9003", "device_lost"),
        ("127.0.0.1:9001", "ok"), ("127.0.0.1:9002", "device_lost")]
    assert got[0].seconds == pytest.approx(6.0)  # ends at the runner's deadline
    assert got[1].seconds == pytest.approx(0.5)
    assert got[2].seconds == pytest.approx(2.0)
    assert got[3].end == pytest.approx(time.time(), abs=1.0)  # no end yet: up to now
    assert path.stat().st_size == 0  # read: the file starts again for the next batch
    write(path, {"sid": "1-2", "phone": "127.0.0.1:9002", "start": now},
          {"sid": "1-2", "artifact": "/b/1.tar"}, {"sid": "1-2", "end": now + 0.5})
    again = log.spans(["/b/1.tar"], ["runtime"], key="k", worker="w", job_id="j",
                      workload_key="wk", task="t", batch="r#2")
    assert [(s.phone, s.seconds, s.outcome) for s in again] == [
        ("127.0.0.1:9002", pytest.approx(0.5), "runtime")]


def test_a_half_written_line_is_not_read(tmp_path):
    path = tmp_path / "phones.jsonl"
    log = PhoneLog(str(path), deadline_s=6.0)
    with open(path, "w") as f:
        f.write('{"sid": "1-1", "phone": "p:1", "start": 1.0}\n{"sid": "1-1", "end')
    assert log.spans([], [], key="k", worker="w", job_id="j", workload_key="wk",
                     task="t", batch="b")[0].outcome == "device_lost"


def sp(phone, start, end, outcome="ok"):
    return PhoneSpan(phone=phone, key="k", worker="w1", job_id="j", workload_key="wk", task="t",
                     batch="b", start=start, end=end, outcome=outcome)


def test_a_job_lists_every_registered_phone_and_one_that_measured_nothing_has_zero_busy():
    spans = [sp("p:1", 10.0, 14.0), sp("p:1", 14.0, 15.0, "device_lost"), sp("p:2", 12.0, 13.0)]
    wall = tuning_wall(spans, started_at=5.0)
    assert wall == 10.0
    rows = {r["phone"]: r for r in job_phones(spans, {"p:1": "w1", "p:3": "w2"}, wall)}
    assert set(rows) == {"p:1", "p:2", "p:3"}
    assert rows["p:1"]["busy_s"] == 5.0 and rows["p:1"]["utilization"] == 0.5
    assert rows["p:1"]["measurements"] == 2 and rows["p:1"]["device_lost"] == 1
    assert rows["p:1"]["mean_ms"] == 2500.0 and rows["p:1"]["idle_s"] == 5.0
    assert rows["p:3"] == {"phone": "p:3", "worker": "w2", "busy_s": 0.0, "measurements": 0,
                           "device_lost": 0, "idle_s": 10.0, "utilization": 0.0,
                           "mean_ms": None}
    assert tuning_wall([], started_at=5.0, until=9.0) == 4.0  # running, nothing measured yet


def test_farm_devices_shows_a_phone_set_aside_and_one_that_rejoined():
    from farm.store.phones import PhoneStat, format_phones, phone_rows

    now = time.time()
    rows = phone_rows([PhoneStat(phone="p:1", key="k", worker="w", busy_s=3.0, work_s=10.0,
                                 measurements=6, device_lost=3, aside_until=now + 120),
                       PhoneStat(phone="p:2", key="k", worker="w", aside_until=now - 1)],
                      registered={"p:1", "p:2"})
    assert rows[0]["aside_until"] == now + 120 and rows[1]["aside_until"] is None
    assert (rows[0]["idle_s"], rows[0]["mean_ms"]) == (7.0, 500.0)
    text = format_phones(rows).splitlines()
    assert "set aside until" in text[1] and "registered" in text[2]


def test_two_hosts_phones_on_their_own_loopback_are_two_phones(monkeypatch):
    """Every host has its own 127.0.0.1:9090: a phone there is named with its machine, so two
    hosts' phones never merge in the store's accounting (a lab address is left as it is)."""
    from farm.core import hostid
    from farm.devices.tracker import phone_address
    from farm.store import open_store
    from farm.store.phones import PhoneSpan

    monkeypatch.setattr(hostid, "machine", lambda: "lab1~aaaa~1")
    hostid.short_machine.cache_clear()
    one = phone_address("127.0.0.1", 9090)
    monkeypatch.setattr(hostid, "machine", lambda: "lab1~bbbb~1")  # a clone: same host name
    hostid.short_machine.cache_clear()
    other = phone_address("127.0.0.1", 9090)
    hostid.short_machine.cache_clear()
    assert one != other and one.startswith("127.0.0.1:9090@") and other.startswith("127.0.0.1:9090@")
    assert phone_address("10.0.0.7", 9090) == "10.0.0.7:9090"
    store = open_store("memory://")
    store.note_phone_spans([PhoneSpan(phone=p, key="k", worker=w, job_id="j", workload_key="wk",
                                      task="t", batch="b", start=1.0, end=2.0, outcome="ok")
                            for p, w in ((one, "farm@a"), (other, "farm@b"))])
    assert len(store.phone_stats()) == 2
