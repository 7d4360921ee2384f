"""Hot and cold (farm/store/cold.py, packing.py): each workload keeps its K fastest whole
records in the store, every other one leaves for the archive, and nothing measured is lost.
Run against both stores (a real Redis for RedisStore)."""

import json
import random

import pytest

from farm.core import keys
from farm.store import StoredRecord, open_store
from farm.store.cold import Archive, all_records, drain
from farm.store.store import best_of

K = 4
# what the records of one workload share (its blocks, loops, instructions): hard to compress
# alone, nearly free with the workload's dictionary
SHARED = f"{random.Random(7).getrandbits(12000):x}"


@pytest.fixture(params=["memory", "redis"])
def cold(request, tmp_path):
    url = "memory://" if request.param == "memory" else request.getfixturevalue("clean_redis")
    s = open_store(url, hot_records=K, archive=str(tmp_path / "archive"))
    yield s
    s.close()


def rec(cand, us, err=None, wk="wk", verified=True, shared=SHARED, at=1e9):
    # a trace as long as a real one (a few KB), mostly shared by every record of a workload
    trace = [[["SamplePerfectTile", [f"l{i}"], [4, 64], [f"v{i}", shared[i * 70:i * 70 + 70]]]
              for i in range(40)],
             [[i, [1, 2, 4, 8]] for i in range(10)] + [[99, cand]]]
    return StoredRecord(workload_key=wk, candidate=cand, record=[trace, [1e-6], {"k": "llvm"}, []],
                        run_us=us, error_class=err, job_id="j1", verified=verified,
                        source="job" if verified else "import:x", measured_at=at)


def fill(store):
    for i in range(10):
        assert store.add_record(rec(f"v{i}", 10.0 + i))
    for i in range(3):
        assert store.add_record(rec(f"f{i}", None, err="runtime"))


def test_the_k_fastest_stay_whole_and_the_rest_reach_the_archive(cold):
    fill(cold)
    hot = {r.candidate for r in cold.records("wk")}
    assert hot == {"v0", "v1", "v2", "v3"}
    assert {e.candidate for e in cold.entries("wk")} == {f"v{i}" for i in range(10)} | {
        "f0", "f1", "f2"}
    assert cold.record_count("wk") == 13
    assert cold.spool_size() == 9
    assert drain(cold, cold.archive) == 9
    assert cold.spool_size() == 0
    everything = all_records(cold, cold.archive, "wk")
    assert sorted(r.candidate for r in everything) == sorted(
        [f"v{i}" for i in range(10)] + ["f0", "f1", "f2"])
    back = {r.candidate: r for r in everything}
    assert back["v7"] == rec("v7", 17.0)  # the whole record, as it was committed
    assert back["f1"].error_class == "runtime"
    assert cold.best("wk").candidate == "v0"


def test_an_archived_candidate_is_still_refused_and_read_back(cold):
    fill(cold)
    drain(cold, cold.archive)
    assert cold.has_candidate("wk", "v9")
    assert not cold.add_record(rec("v9", 3.0))  # measured before it was archived: a duplicate
    assert cold.entry("wk", "v9").run_us == 19.0
    assert cold.get_record("wk", "v9") == rec("v9", 19.0)  # from the archive
    assert cold.get_record("wk", "nope") is None


def test_a_record_not_yet_drained_is_read_back_too(cold):
    fill(cold)
    assert cold.spool_size() == 9
    assert cold.get_record("wk", "v8") == rec("v8", 18.0)  # drains first


def test_failures_leave_first(cold):
    for i in range(K):
        cold.add_record(rec(f"v{i}", 10.0 + i))
    cold.add_record(rec("f0", None, err="build"))
    cold.add_record(rec("v9", 50.0))
    assert {r.candidate for r in cold.records("wk")} == {"v0", "v1", "v2", "v3"}
    cold.add_record(rec("v10", 1.0))
    assert {r.candidate for r in cold.records("wk")} == {"v10", "v0", "v1", "v2"}
    assert cold.best("wk").candidate == "v10"


def test_removed_records_do_not_come_back_from_the_archive(cold):
    fill(cold)
    drain(cold, cold.archive)
    assert cold.remove_records("wk", ["v8", "v0"]) == 2
    left = {r.candidate for r in all_records(cold, cold.archive, "wk")}
    assert "v8" not in left and "v0" not in left and "v9" in left
    assert cold.best("wk").candidate == "v1"


def test_the_best_whole_record_survives_when_its_hot_copy_leaves(cold):
    # an imported claim never is the best; K faster imports push the verified best out of
    # the K, and the best hash still has it
    cold.add_record(rec("b", 20.0))
    for i in range(K):
        cold.add_record(rec(f"i{i}", 1.0 + i, verified=False))
    assert "b" not in {r.candidate for r in cold.records("wk")} - {cold.best("wk").candidate}
    assert cold.best("wk") == rec("b", 20.0)
    assert best_of(cold.records("wk")).candidate == "b"


def test_a_crash_between_archive_and_spool_writes_twice_and_reads_once(cold, tmp_path):
    fill(cold)
    got = cold.spooled(100)
    cold.archive.append_lines("cpu-local", [line for _, line in got.records])  # written, then the process died before unspool
    drain(cold, cold.archive)  # the next drain writes them again
    everything = all_records(cold, cold.archive, "wk")
    assert len(everything) == 13


def test_retention_deletes_old_days_only(tmp_path):
    archive = Archive(str(tmp_path / "a"))
    day = 86400.0
    archive.append("k", [rec("old", 1.0)], now=1_000_000_000.0)
    archive.append("k", [rec("new", 1.0)], now=1_000_000_000.0 + 10 * day)
    assert archive.prune(0, now=1_000_000_000.0 + 10 * day, keep=lambda *_: False) == []
    gone = archive.prune(5, now=1_000_000_000.0 + 10 * day, keep=lambda *_: False)
    assert len(gone) == 1
    assert [r.candidate for r in archive.records()] == ["new"]


def test_redis_keeps_an_archived_record_in_tens_of_bytes(clean_redis, tmp_path):
    store = open_store(clean_redis, hot_records=K, archive=str(tmp_path / "archive"))
    # the first record of a workload is often TVM's default schedule (no trace): not the
    # dictionary the others are packed with
    small = StoredRecord(workload_key="wk", candidate="default", record=[[[], []], [1e-6], {}, []],
                         run_us=500.0, job_id="j1")
    store.add_record(small)
    fill(store)
    assert store.get_record("wk", "default") == small
    drain(store, store.archive)
    entry = store.r.hget(keys.records("wk"), "v9")
    assert len(entry) < 40, entry
    hot = store.rb.hget(keys.hot("wk"), "v0")
    assert len(hot) < len(rec("v0", 10.0).dumps()) / 4  # packed with the workload's dictionary
    for key in store.r.scan_iter():  # v9's whole record is nowhere in Redis
        if store.r.type(key) == "hash":
            assert b"v9" not in b"".join(store.rb.hgetall(key).values()) or key == keys.records(
                "wk")
    store.close()


def test_a_store_of_the_layout_before_is_read_and_kept(clean_redis):
    store = open_store(clean_redis, hot_records=K)
    old = rec("legacy", 5.0)
    store.r.hset(keys.records("wk"), "legacy", old.dumps())  # a whole JSON record, as before
    assert store.entry("wk", "legacy").run_us == 5.0
    assert store.get_record("wk", "legacy") == old
    assert [r.candidate for r in store.records("wk")] == ["legacy"]
    assert not store.add_record(rec("legacy", 1.0))
    store.add_record(rec("n", 7.0))
    assert store.remove_records("wk", ["n"]) == 1  # the best is recomputed from both layouts
    assert json.loads(store.r.hget(keys.best("wk"), "us")) == 5.0
    assert store.best("wk") == old
    store.close()


def test_features_are_kept_as_float16_and_read_back_as_the_cost_model_wrote_them():
    import numpy as np

    from farm.store.packing import pack_features, unpack_features
    from workers.metaschedule.samples import decode, encode

    rng = np.random.default_rng(1)
    x = np.log2(1 + rng.exponential(1000, size=(3, 164))).astype(np.float32)
    x[:, 100:] = 0  # as MetaSchedule's: many zero features
    text = encode(x)
    blob = pack_features(text)
    assert len(blob) < 0.7 * len(text)
    back = decode(unpack_features(blob))
    assert back.shape == x.shape and np.allclose(back, x, rtol=5e-4, atol=0)
    big = encode(np.array([[1e6, 1.0]], dtype=np.float32))  # beyond float16: kept exactly
    assert decode(unpack_features(pack_features(big)))[0, 0] == 1e6
    assert unpack_features(pack_features("")) == ""
    assert unpack_features(pack_features("fa")) == "fa"  # any text the store is given


def test_a_workers_features_stay_on_its_disk_not_in_redis(clean_redis, tmp_path):
    import numpy as np

    from farm.core.messages import TuneTask
    from farm.store.features import LocalFeatures
    from workers.metaschedule.samples import decode, encode

    x = np.ones((2, 164), dtype=np.float32)
    store = open_store(clean_redis, features=str(tmp_path / "f.sqlite"))
    store.put_features("wk", {"a": encode(x), "b": ""})
    got = store.features("wk")
    assert got["b"] == "" and np.array_equal(decode(got["a"]), x)  # ones: exact in float16
    assert not store.r.exists(keys.features("wk"))
    again = LocalFeatures(tmp_path / "f.sqlite")  # another process of the host
    assert set(again.get("wk")) == {"a", "b"}
    store.put_workload(TuneTask(name="t", workload_key="wk", weight=1, mod_json="{}",
                                target={}, device_key="k"))
    store.remove_workload("wk")
    assert again.get("wk") == {}
    broken = LocalFeatures(tmp_path / "f.sqlite" / "x")  # not a usable path: an empty cache
    broken.put("wk", {"a": encode(x)})
    assert broken.get("wk") == {}
    store.close()


def test_a_cost_models_samples_are_chosen_by_entry_and_only_they_are_read_whole(cold,
                                                                               monkeypatch):
    """The key's model picks its samples by their entries (no whole record read), then reads
    those it needs whole: Redis's hot ones and, in one pass, only their lines of the archive
    parsed; a record removed from the store is not read back from the archive."""
    from farm.core.messages import TuneTask
    from farm.store import cold as cold_module
    from farm.store.cold import wholes
    from workers.metaschedule.samples import learnable

    cold.put_workload(TuneTask(name="t", workload_key="wk", weight=1, mod_json="{}",
                               target={}, device_key="k"))
    fill(cold)  # v0..v9 (10..19 us), f0..f2 failed; K=4 whole in the store
    chosen = learnable(cold.entries("wk"))[:7]
    assert [e.candidate for e in chosen] == [f"v{i}" for i in range(7)]
    parsed = []
    real_parse = cold_module._parse
    monkeypatch.setattr(cold_module, "_parse",
                        lambda path, n, line: parsed.append(n) or real_parse(path, n, line))
    got = wholes(cold, cold.archive, "k", {"wk": chosen})["wk"]
    assert got == {f"v{i}": rec(f"v{i}", 10.0 + i) for i in range(7)}  # v0-v3 hot, v4-v6 cold
    assert len(parsed) == 3, parsed  # of the 9 archived lines, only the 3 wanted
    cold.remove_records("wk", ["v4"])  # removed: not chosen, not read back
    again = learnable(cold.entries("wk"))[:7]
    assert "v4" not in {e.candidate for e in again} and "v7" in {e.candidate for e in again}
    assert set(wholes(cold, cold.archive, "k", {"wk": again})["wk"]) == set(
        [f"v{i}" for i in range(8) if i != 4])


def test_each_record_streams_what_every_record_gives(cold):
    """`export --all`'s stream: the same records as every_record (hot ones, then the
    archive's), one per candidate even where a batch was archived twice, none removed."""
    from farm.core.messages import TuneTask
    from farm.store.cold import each_record, every_record

    for wk in ("wk", "wk2"):
        cold.put_workload(TuneTask(name="t", workload_key=wk, weight=1, mod_json="{}",
                                   target={}, device_key="k"))
    fill(cold)
    for i in range(6):
        assert cold.add_record(rec(f"x{i}", 30.0 + i, wk="wk2"))
    assert drain(cold, cold.archive) == 9 + 2
    cold.archive.append("k", [rec("v7", 17.0)])  # a crash between write and trim: twice
    cold.remove_records("wk", ["v8"])
    streamed = list(each_record(cold, cold.archive, ["wk", "wk2"]))
    every = every_record(cold, cold.archive, ["wk", "wk2"])
    assert sorted((r.workload_key, r.candidate) for r in streamed) == sorted(
        (wk, r.candidate) for wk, recs in every.items() for r in recs)
    assert len(streamed) == 12 + 6 and "v8" not in {r.candidate for r in streamed}
    assert {r.candidate: r for r in streamed}["v7"] == rec("v7", 17.0)


# --- the archive never loses or misreads a record (issue 46, item 4) ------------------------
def _task(wk="wk"):
    from farm.core.messages import TuneTask

    return TuneTask(name="t", workload_key=wk, weight=1, mod_json="{}", target={},
                    device_key="k")


def _until(done, what, timeout_s=20.0):
    """Wait for a condition (polled), failing with `what` after `timeout_s`."""
    import time

    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_drainer_that_outlived_its_lease_trims_nothing_it_did_not_write(cold, monkeypatch):
    """Drainer A reads the spool and stalls writing it past its (short) lease; B takes the
    lease and drains everything; newer records are spooled; A wakes up: it must not remove
    them (the old `unspool` trimmed the first n items, whatever they were by then)."""
    import threading

    from farm.store import cold as cold_module

    monkeypatch.setattr(cold_module, "DRAIN_LEASE_S", 0.3)
    cold.put_workload(_task())
    fill(cold)  # 9 records spooled
    reading, resume = threading.Event(), threading.Event()

    class Stalling(Archive):
        def append_lines(self, device_key, lines, now=None):
            reading.set()
            assert resume.wait(30)
            return super().append_lines(device_key, lines, now)

    stalled = Stalling(cold.archive.url)
    a = threading.Thread(target=drain, args=(cold, stalled), kwargs={"owner": "A"})
    a.start()
    assert reading.wait(10)
    _until(lambda: drain(cold, cold.archive, owner="B") == 9, "A's lease to lapse and B drain")
    for i in range(5):  # newer records: slower than the K hot ones, they leave for the spool
        assert cold.add_record(rec(f"n{i}", 40.0 + i))
    assert cold.spool_size() == 5
    resume.set()
    a.join(30)
    assert not a.is_alive()
    drain(cold, cold.archive, owner="C")
    everything = {r.candidate for r in all_records(cold, cold.archive, "wk")}
    assert everything == {e.candidate for e in cold.entries("wk")}
    assert {f"n{i}" for i in range(5)} <= everything


def test_the_drain_lease_is_renewed_per_batch(cold, monkeypatch):
    """A drain longer than its lease, batch after batch, keeps the lease: nobody else can
    take it meanwhile."""
    import time

    from farm.store import cold as cold_module

    monkeypatch.setattr(cold_module, "DRAIN_LEASE_S", 0.6)
    cold.put_workload(_task())
    fill(cold)
    taken = []

    class Slow(Archive):
        def append_lines(self, device_key, lines, now=None):
            time.sleep(0.2)  # a slow archive: 5 batches outlast one lease
            if cold.acquire_lease("spool", "probe", 10) is None:
                taken.append(len(taken))
                cold.release_lease("spool", "probe")
            return super().append_lines(device_key, lines, now)

    assert drain(cold, Slow(cold.archive.url), owner="A", batch=2) == 9
    assert taken == [], "another drainer could take the lease during the drain"


def test_a_removed_and_measured_again_candidate_reads_back_its_new_run(cold, monkeypatch):
    """`farm cache rm` of a candidate, then a new measurement of it: both runs are in the
    archive, the old one in a file whose name sorts later (another host's); every reader
    gives the new run, the one the store's entry describes."""
    from farm.store import cold as cold_module
    from farm.store.cold import each_record, every_record, wholes

    cold.put_workload(_task())
    fill(cold)  # v9 (19 us, measured at 1e9) leaves for the spool
    monkeypatch.setattr(cold_module, "short_machine", lambda: "zz-host")
    drain(cold, cold.archive)
    assert cold.remove_records("wk", ["v9"]) == 1
    again = rec("v9", 25.0, at=2e9)
    assert cold.add_record(again)  # slower than the K hot ones: straight to the spool
    monkeypatch.setattr(cold_module, "short_machine", lambda: "aa-host")  # sorts first
    drain(cold, cold.archive)
    assert cold.get_record("wk", "v9") == again
    assert {r.candidate: r for r in all_records(cold, cold.archive, "wk")}["v9"] == again
    assert {r.candidate: r for r in every_record(cold, cold.archive, ["wk"])["wk"]}[
        "v9"] == again
    assert {r.candidate: r for r in each_record(cold, cold.archive, ["wk"])}["v9"] == again
    entry = cold.entry("wk", "v9")
    assert wholes(cold, cold.archive, "k", {"wk": [entry]})["wk"]["v9"] == again


def test_a_long_lived_drainer_reads_a_workload_removed_and_tuned_again(clean_redis, tmp_path):
    """A drainer (and a worker) that read the workload's compression dictionary before the
    workload was removed and tuned again: every record spooled after is archived and read
    back (a stale dictionary made them "corrupt", and they were trimmed)."""
    url = str(tmp_path / "archive")
    drainer, worker, remover, fresh = (open_store(clean_redis, hot_records=K, archive=url)
                                       for _ in range(4))
    worker.put_workload(_task())
    fill(worker)
    assert drain(drainer, drainer.archive) == 9  # the drainer has the dictionary now
    assert remover.remove_workload("wk")
    other = f"{random.Random(8).getrandbits(12000):x}"  # another first record: its dictionary
    fresh.put_workload(_task())
    for i in range(8):
        assert fresh.add_record(rec(f"a{i}", 10.0 + i, shared=other))
    for i in range(4):  # a worker that read the dictionary before the removal
        assert worker.add_record(rec(f"b{i}", 30.0 + i, shared=other))
    drain(drainer, drainer.archive)
    assert drainer.spool_size() == 0
    reader = open_store(clean_redis, hot_records=K, archive=url)
    back = {r.candidate: r for r in all_records(reader, reader.archive, "wk")}
    assert set(back) == {e.candidate for e in reader.entries("wk")} == {
        *(f"a{i}" for i in range(8)), *(f"b{i}" for i in range(4))}
    assert back["a7"] == rec("a7", 17.0, shared=other)
    for s in (drainer, worker, remover, fresh, reader):
        s.close()


def test_a_reader_whose_dictionary_is_not_the_records_reads_it_again(clean_redis, tmp_path):
    """A store written before dictionaries were kept across a removal made a workload's
    dictionary again: a drainer that cached the older one sees the id the record names and
    reads the dictionary again (it logged the records "corrupt" and trimmed them)."""
    url = str(tmp_path / "archive")
    drainer, worker, fresh = (open_store(clean_redis, hot_records=K, archive=url)
                              for _ in range(3))
    worker.put_workload(_task())
    fill(worker)
    assert drain(drainer, drainer.archive) == 9  # the drainer has the dictionary now
    worker.r.hdel(keys.workload("wk"), "zdict")  # as a removal did before
    other = f"{random.Random(8).getrandbits(12000):x}"
    for i in range(6):  # slower than the K hot ones: spooled, packed with a new dictionary
        assert fresh.add_record(rec(f"a{i}", 30.0 + i, shared=other))
    assert drain(drainer, drainer.archive) == 6
    assert drainer.dead_letters() == 0
    assert drainer.get_record("wk", "a5") == rec("a5", 35.0, shared=other)
    for s in (drainer, worker, fresh):
        s.close()


def test_an_unreadable_spool_item_goes_to_the_dead_letter_list(clean_redis, tmp_path):
    """An item of the spool that cannot be read is kept (moved to the dead-letter list), never
    trimmed; the readable ones around it are archived."""
    store = open_store(clean_redis, hot_records=K, archive=str(tmp_path / "archive"))
    store.put_workload(_task())
    for i in range(K + 2):
        store.add_record(rec(f"v{i}", 10.0 + i))
    bad = b"wk\nz" + b"\x00not a record packed with any dictionary"
    store.rb.rpush(keys.spool(), bad)
    store.add_record(rec("v9", 19.0))
    assert store.spool_size() == 4
    assert drain(store, store.archive) == 3
    assert store.spool_size() == 0
    lists = [k for k in store.r.scan_iter() if store.r.type(k) == "list"]
    assert any(bad in store.rb.lrange(k, 0, -1) for k in lists), "the unreadable item is gone"
    assert store.dead_letters() == 1
    assert store.rb.lrange(keys.spool_dead(), 0, -1) == [bad]
    from farm.client import cache, doctor

    assert cache.stats(store)["dead_letters"] == 1  # people see them
    check = doctor.check_capacity(clean_redis)
    assert check.warn and "1 spooled records could not be read" in check.detail, check
    store.close()


def test_retention_keeps_every_record_a_best_or_a_pick_refers_to(cold):
    """Retention deletes old days, but not the whole record of a workload's best (one kept
    in the archive only) nor of a job's final pick: those are carried into a newer day."""
    import time

    from farm.core.messages import JobSpec
    from farm.jobs.supervisor import Supervisor

    cold.put_workload(_task())
    cold.put_job(JobSpec(job_id="j1", model="m", device_key="k", target={}, trials_per_task=8,
                         round_trials=4, workload_keys=["wk"], task_names={"wk": "t"},
                         weights={"wk": 1}))
    fill(cold)
    for i in range(K):  # faster imports push the verified records out of the K hot ones
        assert cold.add_record(rec(f"i{i}", 1.0 + i, verified=False))
    assert cold.finalize_once("j1", {"wk": "v7"})[1]
    assert cold.remove_records("wk", ["v0"]) == 1  # the best now: v1, in the archive only
    sup = Supervisor(None, cold, None, node="n", interval_s=1, grace_s=1)  # type: ignore[arg-type]
    sup.retention_days = 5
    sup.keep_archive(now=time.time() + 10 * 86400)
    assert cold.best("wk") == rec("v1", 11.0)
    assert cold.get_record("wk", "v7") == rec("v7", 17.0)
    assert cold.get_record("wk", "v8") is None  # the rest of the old day: deleted
    sup.keep_archive(now=time.time() + 20 * 86400)  # and again, ten days later
    assert cold.best("wk") == rec("v1", 11.0)
    assert cold.get_record("wk", "v7") == rec("v7", 17.0)


def test_redis_away_while_the_drain_reads_is_no_dead_letter(clean_redis, tmp_path, monkeypatch):
    """A Redis error while a spooled record is read (its dictionary) is Redis away a moment,
    not an unreadable record: nothing goes to the dead-letter list, the next drain moves it."""
    import redis

    store = open_store(clean_redis, hot_records=K, archive=str(tmp_path / "archive"))
    store.put_workload(_task())
    for i in range(K + 2):
        store.add_record(rec(f"v{i}", 10.0 + i))
    spooled = store.spool_size()
    assert spooled > 0
    records = store._records  # the spool reads a record's dictionary through the records part
    records._zdict_cache.clear()
    real = records._zdict

    def away(*args, **kwargs):
        raise redis.ConnectionError("Redis away")

    monkeypatch.setattr(records, "_zdict", away)
    with pytest.raises(redis.ConnectionError):
        drain(store, store.archive)
    assert (store.dead_letters(), store.spool_size()) == (0, spooled)
    monkeypatch.setattr(records, "_zdict", real)
    assert drain(store, store.archive) == spooled
    assert store.dead_letters() == 0
    store.close()
