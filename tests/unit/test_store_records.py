"""The store contract, the records protocol (farm/store/store.py: RecordReader, RecordWriter): keep-best, idempotent commits, provenance, removal: run against every implementation (in-memory and real Redis)."""

import threading

import pytest

from farm.core import keys
from farm.core.messages import TuneTask
from farm.store import StoredRecord, candidate_hash, is_better, open_store
from tests.unit.conftest import rec


def imported(cand: str, us: float | None, wk: str = "wk"):
    return StoredRecord(workload_key=wk, candidate=cand, record=[{"t": cand}, [1.0], {}, []],
                        run_us=us, job_id="", host="laptop", source="import:log",
                        verified=False)


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
    keep_best = s._conn.scripts.keep_best  # the script itself, past add_record's check
    for bad in ("0", "-1", "nan", "inf", "1e-400x", "0.0"):
        with pytest.raises(redis_lib.ResponseError, match="refused"):
            keep_best(keys=[keys.records("wk"), keys.best("wk"), "", "", keys.unverified("wk")],
                      args=["c", rec("c", 1.0).dumps(), bad, "wk", "1", "1", ""])
    assert s.record_count("wk") == 0 and s.best("wk") is None


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
