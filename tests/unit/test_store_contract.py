"""The store contract, run against every implementation (in-memory and real Redis)."""

import threading

import pytest

from farm import keys
from farm.messages import JobSpec, TuneTask
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
                                             "device_lost": 1}}
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
    store.mark_round_done("r")
    assert store.round_is_done("r")


def test_starts_that_never_ended_are_counted(store):
    assert store.round_started("p") == 0
    store.round_ended("p")
    assert store.round_started("p") == 0  # the first ended cleanly
    assert store.round_started("p") == 1  # the second did not end (its process died)
    assert store.round_started("p") == 2


def test_active_jobs_and_one_supervisor_leads(store):
    store.set_active("j1", True)
    store.set_active("j2", True)
    store.set_active("j1", False)
    assert store.active_jobs() == ["j2"]
    assert store.lead("w1", ttl_s=30)
    assert store.lead("w1", ttl_s=30)
    assert not store.lead("w2", ttl_s=30)
