"""The store contract, run against every implementation (in-memory and real Redis)."""

import threading

import pytest

from farm.core import keys
from farm.core.messages import JobSpec, TuneTask
from farm.store import StoredRecord, TaskState, candidate_hash, is_better, open_store


@pytest.fixture(params=["memory", "redis"])
def store(request):
    if request.param == "memory":
        s = open_store("memory://")
    else:
        s = open_store(request.getfixturevalue("clean_redis"))
    yield s
    s.close()


def rec(cand: str, us: float | None, wk: str = "wk", job: str = "j1", err: str | None = None):
    return StoredRecord(workload_key=wk, candidate=cand, record=[{"t": cand}, [1.0], {}, []],
                        run_us=us, error_class=err, job_id=job)


def test_keep_best_and_idempotent_commit(store):
    assert store.add_record(rec("a", 50.0))
    assert store.add_record(rec("b", 20.0))
    assert store.add_record(rec("c", 30.0))
    assert not store.add_record(rec("b", 1.0))  # same candidate again: ignored entirely
    assert store.add_record(rec("d", None, err="build"))  # failures are kept, never best
    assert store.best("wk").candidate == "b"
    assert store.best("wk").run_us == 20.0
    assert store.record_count("wk") == 4
    assert store.job_measured("j1") == {"wk": 4}
    assert store.has_candidate("wk", "a") and not store.has_candidate("wk", "zz")


def test_concurrent_commits_keep_the_true_best(store):
    def worker(offset):
        for i in range(50):
            store.add_record(rec(f"c{offset}-{i}", float(1000 - offset * 50 - i)))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.record_count("wk") == 200
    assert store.best("wk").run_us == min(1000 - k * 50 - i for k in range(4) for i in range(50))


def test_workloads_first_writer_wins(store):
    task = TuneTask(name="n", workload_key="wk1", weight=1, mod_json="{}", target={"kind": "llvm"},
                    device_key="k")
    assert store.put_workload(task, "j1")
    other = TuneTask(name="other", workload_key="wk1", weight=1, mod_json="{}",
                     target={"kind": "llvm"}, device_key="k")
    assert not store.put_workload(other, "j2")
    assert store.get_workload("wk1") == task
    assert store.workload_keys() == ["wk1"]
    assert store.get_workload("missing") is None


def test_jobs_and_task_states(store):
    spec = JobSpec(job_id="j9", model="m", device_key="k", target={"kind": "llvm"},
                   trials_per_task=4, round_trials=4, workload_keys=["a"], task_names={"a": "x"},
                   weights={"a": 1}, created_at=1.0)
    store.put_job(spec)
    assert store.get_job("j9") == spec and "j9" in store.job_ids()
    store.set_task_state("j9", "a", TaskState(state="tuning", rounds=1))
    assert store.task_states("j9")["a"].state == "tuning"
    store.set_job_status("j9", state="running")
    assert store.job_status("j9") == {"state": "running"}


def test_claim_once(store):
    assert store.claim(keys.round_sent("r1"))
    assert not store.claim(keys.round_sent("r1"))
    assert store.claim(keys.round_sent("r2"), ttl_s=60)


def test_corrupt_record_is_skipped(clean_redis):
    import redis

    s = open_store(clean_redis)
    s.add_record(rec("good", 5.0))
    redis.Redis.from_url(clean_redis).hset(keys.records("wk"), "bad", "{not json")
    got = s.records("wk")
    assert [r.candidate for r in got] == ["good"]


def test_is_better_and_candidate_hash():
    assert is_better(1.0, None) and is_better(1.0, 2.0) and not is_better(3.0, 2.0)
    assert not is_better(None, None)
    assert candidate_hash([{"a": 1}, [1.0]]) == candidate_hash([{"a": 1}, [2.0]])
    assert candidate_hash([{"a": 1}]) != candidate_hash([{"a": 2}])


def test_exhausted_flag(store):
    assert not store.exhausted("wk")
    store.mark_exhausted("wk", 1)
    assert store.exhausted("wk")


def test_lease_one_holder_at_a_time_and_expiry(store):
    import time

    assert store.acquire_lease("wk", "job1", ttl_s=0.5) is None
    assert store.acquire_lease("wk", "job1", ttl_s=0.5) is None  # renew by its holder
    assert store.acquire_lease("wk", "job2", ttl_s=0.5) == "job1"
    store.release_lease("wk", "job2")  # not the holder: nothing happens
    assert store.acquire_lease("wk", "job2", ttl_s=0.5) == "job1"
    time.sleep(0.7)  # a dead holder's lease expires
    assert store.acquire_lease("wk", "job2", ttl_s=5) is None
    store.release_lease("wk", "job2")
    assert store.acquire_lease("wk", "job3", ttl_s=5) is None


def test_allocate_never_exceeds_the_budget(store):
    assert store.allocate("j", 4, 10) == 4
    assert store.allocate("j", 4, 10) == 4
    assert store.allocate("j", 4, 10) == 2
    assert store.allocate("j", 4, 10) == 0
    assert store.allocate("other", 3, 10) == 3


def test_finalize_once_keeps_the_first_choice(store):
    store.add_record(rec("a", 5.0))
    assert store.get_record("wk", "a").run_us == 5.0
    assert store.get_record("wk", "nope") is None
    assert store.final_picks("j1") is None
    picks, first = store.finalize_once("j1", {"wk": "a"})
    assert first and picks == {"wk": "a"}
    picks, first = store.finalize_once("j1", {"wk": "b"})  # a late finalizer gets the first
    assert not first and picks == {"wk": "a"}
    assert store.final_picks("j1") == {"wk": "a"}
    store.set_task_state("j1", "wk", TaskState(state="done"))
    store.allocate("j1", 5, 10)
    store.reset_job("j1")  # a resumed job runs again and is finalized again
    assert store.final_picks("j1") is None
    assert store.task_states("j1") == {} and store.job_measured("j1") == {}
    assert store.allocate("j1", 10, 10) == 10
    assert store.record_count("wk") == 1  # records are never forgotten
    assert store.finalize_once("j1", {"wk": "b"}) == ({"wk": "b"}, True)


def test_every_phone_measurement_is_counted_and_a_second_one_is_a_duplicate(store):
    assert store.add_record(rec("a", 5.0))
    assert not store.add_record(rec("a", 4.0))  # the same candidate measured again
    assert store.add_record(rec("b", None, err="build"))  # never on a phone: not counted
    assert store.add_record(rec("c", None, err="runtime"))
    assert store.add_record(rec("i", 3.0, job=""))  # an import: no job, no count
    store.count_measurements("j1", "wk", measurements=1, device_lost=1)
    assert store.job_counts("j1") == {"wk": {"measurements": 4, "new": 2, "duplicates": 1,
                                             "device_lost": 1, "retries": 0}}
    store.reset_job("j1")  # `farm resume`: the counters cover every run of the job
    assert store.job_counts("j1")["wk"]["duplicates"] == 1


def test_a_round_runs_as_one_copy_and_never_after_it_is_done(store):
    assert store.acquire_round("r", "copy1", ttl_s=30) is None
    assert store.acquire_round("r", "copy1", ttl_s=30) is None  # renewed by its holder
    assert store.acquire_round("r", "copy2", ttl_s=30) == "copy1"
    assert store.round_holder("r") == "copy1"
    assert store.acquire_round("r", "copy2", ttl_s=30, dead_holder="other") == "copy1"
    assert store.acquire_round("r", "copy2", ttl_s=30, dead_holder="copy1") is None
    store.release_round("r", "copy1")  # not its holder any more: nothing happens
    assert store.round_holder("r") == "copy2"
    store.release_round("r", "copy2")
    assert store.round_holder("r") is None
    assert store.acquire_round("short", "a", ttl_s=0.2) is None
    import time

    time.sleep(0.3)
    assert store.acquire_round("short", "b", ttl_s=30) is None  # a dead holder's lease expired
    assert not store.round_is_done("r")
    assert store.acquire_round("r", "copy3", ttl_s=30) is None
    assert not store.finish_round("r", "copy2")  # fenced out: copy3 holds it now
    assert not store.round_is_done("r") and store.round_holder("r") == "copy3"
    assert store.finish_round("r", "copy3")  # the holder: done, and its lease released
    assert store.round_is_done("r") and store.round_holder("r") is None
    assert store.finish_round("free", "anyone")  # no holder (its lease expired): done


def test_starts_that_never_ended_are_counted(store):
    assert store.round_started("p") == 0
    store.round_ended("p")
    assert store.round_started("p") == 0  # the first ended cleanly
    assert store.round_started("p") == 1  # the second did not end (its process died)
    assert store.round_started("p") == 2


def test_copies_of_a_round_that_began_tuning_are_counted(store):
    from farm.store.store import total_counts

    assert store.round_tunings("q") == 0
    assert store.round_tunings("q", add=1) == 0  # the first copy
    assert store.round_tunings("q", add=1) == 1  # a copy after it: the round runs again
    assert store.round_tunings("q") == 2 and store.round_tunings("other") == 0
    store.count_measurements("j", "wk", retries=1)
    store.count_measurements("j", "wk", device_lost=2)
    assert store.job_counts("j")["wk"]["retries"] == 1
    assert "retries" not in total_counts(store.job_counts("j"))  # not a measurement


def test_active_jobs_and_one_supervisor_leads(store):
    store.set_active("j1", True)
    store.set_active("j2", True)
    store.set_active("j1", False)
    assert store.active_jobs() == ["j2"]
    assert store.lead("w1", ttl_s=30)
    assert store.lead("w1", ttl_s=30)
    assert not store.lead("w2", ttl_s=30)


# --- trust: valid times, unverified imports, records from another TVM, removal -------------
@pytest.mark.parametrize("bad", [0.0, -3.0, float("nan"), float("inf"), -float("inf"), 1e17])
def test_a_time_that_is_not_finite_and_positive_is_refused(store, bad):
    from farm.core.errors import StoreError

    assert store.add_record(rec("good", 40.0))
    with pytest.raises(StoreError, match="not a finite number > 0"):
        store.add_record(rec("bad", bad))
    assert not store.has_candidate("wk", "bad")
    assert store.best("wk").candidate == "good"
    assert store.record_count("wk") == 1


def test_the_redis_script_refuses_a_bad_time_itself(clean_redis):
    """The second guard: a writer that skips the Python check (an old client) is refused too."""
    import redis as redis_lib

    s = open_store(clean_redis)
    s.r  # noqa: B018 - registers the scripts
    for bad in ("0", "-1", "nan", "inf", "1e-400x", "0.0"):
        with pytest.raises(redis_lib.ResponseError, match="refused"):
            s._script(keys=[keys.records("wk"), keys.best("wk"), "", "", keys.unverified("wk")],
                      args=["c", rec("c", 1.0).dumps(), bad, "wk", "1", "1", ""])
    assert s.record_count("wk") == 0 and s.best("wk") is None


def imported(cand: str, us: float | None, wk: str = "wk"):
    return StoredRecord(workload_key=wk, candidate=cand, record=[{"t": cand}, [1.0], {}, []],
                        run_us=us, job_id="", host="laptop", source="import:log",
                        verified=False)


def test_an_imported_record_is_never_best_until_a_phone_measures_it(store):
    assert store.add_record(rec("a", 50.0))
    assert store.add_record(imported("fake", 1e-3))  # claims 0.001 us
    assert store.best("wk").candidate == "a"
    assert store.record_count("wk") == 1 and store.unverified_count("wk") == 1
    assert store.job_counts("j1")["wk"]["measurements"] == 1  # an import is no measurement
    assert not store.add_record(imported("fake", 1e-4))  # importing it again changes nothing
    # a phone of the farm measures it: the measurement replaces the import, counted as new
    assert store.add_record(rec("fake", 80.0, job="j2"))
    assert store.get_record("wk", "fake").verified and store.get_record("wk", "fake").run_us == 80.0
    assert store.best("wk").candidate == "a"
    assert store.record_count("wk") == 2 and store.unverified_count("wk") == 0
    assert store.job_counts("j2")["wk"]["new"] == 1
    assert not store.add_record(rec("fake", 70.0, job="j3"))  # now verified: a duplicate
    assert store.job_counts("j3")["wk"]["duplicates"] == 1
    assert store.add_record(imported("good", 5.0))
    assert store.add_record(rec("good", 10.0, job="j2"))
    assert store.best("wk").candidate == "good" and store.best("wk").run_us == 10.0


def test_a_record_of_another_tvm_version_is_replaced_when_measured_again(store):
    old = StoredRecord(workload_key="wk", candidate="x", record=[{"t": "x"}, [1.0], {}, []],
                       run_us=5.0, job_id="j0", tvm="0.20.0")
    assert store.add_record(old)
    assert store.add_record(rec("y", 9.0))
    assert store.best("wk").candidate == "x"
    same = StoredRecord(workload_key="wk", candidate="x", record=[{"t": "x"}, [1.0], {}, []],
                        run_us=12.0, job_id="j1", tvm="0.20.0")
    assert not store.add_record(same)  # same version: a duplicate
    now = StoredRecord(workload_key="wk", candidate="x", record=[{"t": "x"}, [1.0], {}, []],
                       run_us=12.0, job_id="j1", tvm="0.27.0")
    assert store.add_record(now)  # this TVM builds it slower: the best moves to y
    assert store.best("wk").candidate == "y" and store.get_record("wk", "x").run_us == 12.0


def test_removing_records_recomputes_the_best(store):
    for cand, us in (("a", 30.0), ("b", 10.0), ("c", 20.0)):
        assert store.add_record(rec(cand, us))
    assert store.add_record(imported("d", 1.0))
    assert store.remove_records("wk", ["b", "d", "nothing"]) == 2
    assert store.best("wk").candidate == "c"
    assert store.record_count("wk") == 2 and store.unverified_count("wk") == 0
    assert store.remove_records("wk", ["a", "c"]) == 2
    assert store.best("wk") is None


def test_removing_a_workload_forgets_it(store):
    task = TuneTask(name="n", workload_key="wk", weight=1, mod_json="{}", target={"kind": "llvm"},
                    device_key="k")
    store.put_workload(task)
    store.add_record(rec("a", 3.0))
    store.add_record(imported("b", 1.0))
    assert store.remove_workload("wk")
    assert store.get_workload("wk") is None and "wk" not in store.workload_keys()
    assert store.records("wk") == [] and store.best("wk") is None
    assert store.record_count("wk") == 0
    assert not store.remove_workload("wk")


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


def span(phone: str, start: float, end: float, outcome: str = "ok", job: str = "j1",
         key: str = "k"):
    from farm.store.phones import PhoneSpan

    return PhoneSpan(phone=phone, key=key, worker="w1", job_id=job, workload_key="wk",
                     task="dense", batch="r#1", start=start, end=end, outcome=outcome)


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
