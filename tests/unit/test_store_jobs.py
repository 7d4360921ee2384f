"""The store contract, the jobs protocol (farm/store/jobs.py: JobReader, JobWriter): specs, task states, final choice, counters: run against every implementation (in-memory and real Redis)."""



from farm.core.messages import JobSpec
from farm.store import TaskState
from tests.unit.conftest import rec


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


def test_a_name_is_held_by_one_running_job_at_a_time(store):
    import threading

    import pytest

    from farm.core.errors import StoreError

    for job_id in ("j1", "j2", "j3"):
        store.put_job(JobSpec(job_id=job_id, model="m", device_key="k", target={},
                              trials_per_task=4, round_trials=4, workload_keys=["a"],
                              task_names={"a": "x"}, weights={"a": 1}, created_at=1.0))
    store.set_job_status("j1", state="running")
    assert store.claim_name("nightly", "j1") is None and store.job_named("nightly") == "j1"
    assert store.claim_name("nightly", "j1") is None  # its own: kept (a resumed job)
    store.set_job_status("j2", state="running")
    assert store.claim_name("nightly", "j2") == "j1"  # j1 runs: refused, the name stays
    assert store.require_job("nightly").job_id == "j1" and store.require_job("j2").job_id == "j2"
    store.set_job_status("j1", state="finalized")
    assert store.claim_name("nightly", "j2") is None  # j1 ended: the name moves to j2
    assert store.require_job("nightly").job_id == "j2"
    with pytest.raises(StoreError, match="no such job"):
        store.require_job("weekly")
    # two jobs claim one free name at once: one gets it, the other is told who has it
    store.set_job_status("j2", state="cancelled")
    store.set_job_status("j3", state="running")
    got: dict[str, str | None] = {}
    threads = [threading.Thread(target=lambda j=j: got.update({j: store.claim_name("race", j)}))
               for j in ("j2", "j3")]
    store.set_job_status("j2", state="running")
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winner = store.job_named("race")
    assert sorted(got.values(), key=str) == sorted([None, winner], key=str), got
