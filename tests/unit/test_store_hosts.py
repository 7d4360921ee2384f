"""The store contract, the hosts, phones and cost-model protocols (farm/store/hosts.py, phones.py, learned.py): run against every implementation (in-memory and real Redis)."""


import pytest

from farm.core.messages import TuneTask


def span(phone: str, start: float, end: float, outcome: str = "ok", job: str = "j1",
         key: str = "k"):
    from farm.store.phones import PhoneSpan

    return PhoneSpan(phone=phone, key=key, worker="w1", job_id=job, workload_key="wk",
                     task="dense", batch="r#1", start=start, end=end, outcome=outcome)


def test_host_heartbeats_expire_and_can_be_removed(store):
    import time

    from farm.store.hosts import HostBeat

    phones = {"pixel": {"total": 2, "free": 1, "busy": 1}}
    store.publish_host(HostBeat(name="farm@b", tracker="10.0.0.2:9190", phones=phones), 30)
    store.publish_host(HostBeat(name="farm@a", tracker="10.0.0.1:9190"), 1)
    assert [h.name for h in store.hosts()] == ["farm@a", "farm@b"]
    assert store.hosts()[1].phones == phones
    store.remove_host("farm@b")
    deadline = time.monotonic() + 5
    while store.hosts() and time.monotonic() < deadline:  # farm@a's beat was for 1 s
        time.sleep(0.1)
    assert store.hosts() == []


def test_workloads_are_indexed_by_model_key_with_their_features_and_model(store):
    from farm.store.learned import model_key

    def task(wk, key="k", target=None):
        return TuneTask(name="n", workload_key=wk, weight=1, mod_json="{}",
                        target=target or {"kind": "llvm", "mcpu": "a"}, device_key=key)

    mkey = model_key("k", {"mcpu": "a", "kind": "llvm"})  # the target's key order is not part
    assert mkey == model_key("k", {"kind": "llvm", "mcpu": "a"}) != model_key("k2", {"kind": "llvm"})
    assert mkey != model_key("k", {"kind": "llvm", "mcpu": "b"})
    for wk in ("w2", "w1"):
        store.put_workload(task(wk))
    store.put_workload(task("other", key="k2"))
    store.put_workload(task("w1"))  # stored before: still indexed once
    assert store.model_workloads(mkey) == ["w1", "w2"]
    store.put_features("w1", {"a": "fa", "b": "fb"})
    store.put_features("w1", {"b": "fb2"})
    assert store.features("w1") == {"a": "fa", "b": "fb2"} and store.features("w2") == {}
    assert store.cost_model(mkey) == {}
    store.put_cost_model(mkey, {"booster": "x", "samples": "10", "stale": "1"})
    store.put_cost_model(mkey, {"booster": "y", "samples": "20"})  # replaced whole
    assert store.cost_model(mkey) == {"booster": "y", "samples": "20"}
    store.put_cost_model(mkey, {})
    assert store.cost_model(mkey) == {}
    assert store.remove_workload("w1")
    assert store.model_workloads(mkey) == ["w2"] and store.features("w1") == {}


def test_phone_spans_add_to_their_phone_and_their_job(store):
    store.note_phone_spans([span("10.0.0.1:9000", 100.0, 101.5),
                            span("10.0.0.2:9000", 100.0, 100.25, outcome="build"),
                            span("10.0.0.1:9000", 102.0, 108.0, outcome="device_lost")])
    store.note_phone_spans([span("10.0.0.1:9000", 110.0, 110.5, job="j2")])
    store.add_phone_work("k", "10.0.0.1:9000", "w1", 20.0)
    store.add_phone_work("k", "10.0.0.3:9000", "w1", 20.0)  # had work, measured nothing
    stats = {s.phone: s for s in store.phone_stats()}
    assert set(stats) == {"10.0.0.1:9000", "10.0.0.2:9000", "10.0.0.3:9000"}
    one = stats["10.0.0.1:9000"]
    assert (one.measurements, one.device_lost) == (3, 1)
    assert one.busy_s == pytest.approx(8.0) and one.idle_s == pytest.approx(12.0)
    assert one.mean_ms == pytest.approx(8000 / 3) and one.last_at == 110.5
    assert stats["10.0.0.2:9000"].busy_s == pytest.approx(0.25)
    idle = stats["10.0.0.3:9000"]
    assert (idle.busy_s, idle.measurements, idle.idle_s, idle.mean_ms) == (0.0, 0, 20.0, None)
    assert [(s.phone, s.start, s.outcome) for s in store.job_phone_spans("j1")] == [
        ("10.0.0.1:9000", 100.0, "ok"), ("10.0.0.2:9000", 100.0, "build"),
        ("10.0.0.1:9000", 102.0, "device_lost")]
    assert [s.end for s in store.job_phone_spans("j2")] == [110.5]
    assert store.job_phone_spans("nope") == []


def test_a_phone_lost_too_often_within_the_window_is_set_aside(store):
    args = dict(window_s=60.0, limit=3, aside_s=300.0)
    assert store.phone_lost("k", "p:1", at=1000.0, **args) == 0.0
    assert store.phone_lost("k", "p:1", at=1070.0, **args) == 0.0  # 1000 is out of the window
    assert store.phone_lost("k", "p:1", at=1080.0, **args) == 0.0
    assert store.phone_lost("k", "p:2", at=1085.0, **args) == 0.0  # another phone's own count
    assert store.phone_lost("k", "p:1", at=1090.0, **args) == 1390.0  # 1070, 1080, 1090
    assert {s.phone: s.aside_until for s in store.phone_stats()} == {"p:1": 1390.0}
    assert store.phone_lost("k", "p:1", at=1095.0, **args) == 0.0  # counting starts again


def test_spans_of_the_layout_before_are_read_with_the_new(clean_redis):
    from farm.core import keys
    from farm.store import open_store

    store = open_store(clean_redis)
    store.r.rpush(keys.job_phone_spans("j1"), span("10.0.0.9:9000", 90.0, 91.0).dumps())
    store.note_phone_spans([span("10.0.0.1:9000", 100.0, 101.5),
                            span("10.0.0.2:9000", 100.0, 100.25)])
    assert [s.start for s in store.job_phone_spans("j1")] == [90.0, 100.0, 100.0]
    assert store.r.llen(keys.job_phone_spans("j1")) == 2  # a batch is one item
    store.close()


def test_a_phone_slower_than_its_fastest_reading_by_more_than_the_share_is_hot(store):
    args = dict(share=0.25, rest_s=100.0)
    assert store.phone_heat("k", "p:1", 40.0, at=1000.0, **args) == (False, 40.0, 0.0)
    assert store.phone_heat("k", "p:1", 30.0, at=1010.0, **args) == (False, 30.0, 1000.0)
    assert store.phone_heat("k", "p:1", 37.0, at=1020.0, **args) == (False, 30.0, 1010.0)
    assert store.phone_heat("k", "p:2", 80.0, at=1025.0, **args) == (False, 80.0, 0.0)  # its own
    # one slow reading is not heat: a moment's load; the next one, cool, clears it
    assert store.phone_heat("k", "p:1", 39.0, at=1022.0, **args) == (False, 30.0, 1020.0)
    assert store.phone_heat("k", "p:1", 36.0, at=1024.0, **args) == (False, 30.0, 1020.0)
    assert store.phone_heat("k", "p:1", 38.5, at=1026.0, **args) == (False, 30.0, 1024.0)
    assert {s.phone: s for s in store.phone_stats()}["p:1"].aside_until == 0.0
    hot, base, cool_at = store.phone_heat("k", "p:1", 38.0, at=1030.0, **args)  # 30 * 1.25 < 38
    assert (hot, base, cool_at) == (True, 30.0, 1024.0)  # the second slow one in a row
    stats = {s.phone: s for s in store.phone_stats()}
    assert stats["p:1"].aside_until == 1130.0 and stats["p:1"].aside_why == "hot"
    assert stats["p:1"].hot == 1 and stats["p:1"].heat_base_us == 30.0
    assert stats["p:1"].heat == pytest.approx(38.0 / 30.0 - 1)
    assert stats["p:2"].hot == 0 and stats["p:2"].aside_until == 0.0
    # a hot reading neither lowers the baseline nor counts as the last cool one
    assert store.phone_heat("k", "p:1", 31.0, at=1040.0, **args) == (False, 30.0, 1024.0)
    assert store.phone_lost("k", "p:2", at=1050.0, window_s=60.0, limit=1, aside_s=5.0)
    assert {s.phone: s.aside_why for s in store.phone_stats()}["p:2"] == "lost"
