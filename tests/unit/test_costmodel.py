"""The key's cost model's bookkeeping: features kept as text, failures learned last, and when
the model is stale (the real training and ranking: tests/integration/test_costmodel.py)."""

from __future__ import annotations

import numpy as np

from farm.core.messages import TuneTask
from farm.store import StoredRecord, open_store
from farm.store.learned import model_key


def test_features_survive_the_store_text_exactly():
    from workers.metaschedule.samples import decode, encode

    x = np.random.default_rng(1).random((3, 164)).astype(np.float32)
    assert np.array_equal(decode(encode(x)), x)
    assert decode("") is None


def test_records_are_learned_best_first_with_failures_last_and_lost_phones_never():
    from workers.metaschedule.samples import cost_of, learnable

    recs = [StoredRecord(workload_key="w", candidate=c, record=[], run_us=us, error_class=err)
            for c, us, err in [("a", 5.0, None), ("b", None, "build"), ("c", 2.0, None),
                               ("d", None, "device_lost"), ("e", None, "culprit")]]
    assert [r.candidate for r in learnable(recs)] in (["c", "a", "b", "e"], ["c", "a", "e", "b"])
    assert cost_of(recs[2]) == 2e-6 and cost_of(recs[1]) == 1e10


def test_the_model_is_stale_when_its_key_grew_by_a_quarter():
    from workers.metaschedule import costmodel

    store = open_store("memory://")
    target = {"kind": "llvm"}
    mkey = model_key("k", target)
    for wk in ("w1", "w2"):
        store.put_workload(TuneTask(name=wk, workload_key=wk, weight=1, mod_json="{}",
                                    target=target, device_key="k"))

    def grow(wk, n):
        start = store.record_count(wk)
        for i in range(start, start + n):
            store.add_record(StoredRecord(workload_key=wk, candidate=f"{wk}-{i}",
                                          record=[{"i": i}], run_us=1.0 + i))

    grow("w1", costmodel.MIN_SAMPLES - 1)
    assert not costmodel.stale(store, mkey, {})  # too few records for any model
    grow("w2", 1)
    assert costmodel.stale(store, mkey, {})  # enough, and no model yet
    trained = {"samples": str(costmodel.MIN_SAMPLES)}
    assert not costmodel.stale(store, mkey, trained)
    grow("w2", costmodel.MIN_GROWTH - 1)
    assert not costmodel.stale(store, mkey, trained)
    grow("w1", 1)
    assert costmodel.stale(store, mkey, trained)
    big = {"samples": "1000"}
    grow("w1", 1000 - store.record_count("w1") - store.record_count("w2") + 249)
    assert not costmodel.stale(store, mkey, big)  # grew by 249 of 1000
    grow("w2", 1)
    assert costmodel.stale(store, mkey, big)


def test_imported_and_other_version_records_neither_train_nor_become_best():
    """Until a phone of this farm re-measures them: an imported (unverified) record and one
    timed under another TVM version are left out of training and of a job's final pick."""
    from tvm import __version__ as here

    from farm.jobs.finalize import trusted_best
    from workers.metaschedule.samples import learnable

    def rec(c: str, us: float, **kw) -> StoredRecord:
        return StoredRecord(workload_key="w", candidate=c, record=[], run_us=us, job_id="j", **kw)

    recs = [rec("mine", 5.0, tvm=here), rec("imported", 1.0, verified=False, source="import:x"),
            rec("old", 2.0, tvm="0.20.0")]
    assert [r.candidate for r in learnable(recs)] == ["mine"]
    store = open_store("memory://")
    for r in recs:
        store.add_record(r)
    assert store.best("w").candidate == "old"  # the store's raw best: another version's time
    assert trusted_best(store, "w").candidate == "mine"


def test_a_sample_the_host_cannot_read_whole_is_not_looked_for_again(monkeypatch, tmp_path):
    """The key's model picks its samples by their entries; one whose whole record is in no
    archive this host reads (here: none) is marked featureless once, not sought at every
    training."""
    from farm.core.messages import TuneTask
    from farm.store import StoredRecord, open_store
    from workers.metaschedule import samples

    store = open_store("memory://", hot_records=2, features=str(tmp_path / "f.sqlite"))
    store.put_workload(TuneTask(name="t", workload_key="w", weight=1, mod_json="{}",
                                target={}, device_key="k"))
    for i in range(5):
        store.add_record(StoredRecord(workload_key="w", candidate=f"c{i}", record=[{}, [1.0]],
                                      run_us=10.0 + i))
    featurized: list[list[str]] = []
    monkeypatch.setattr(samples, "featurize", lambda task, recs, threads=1: (
        featurized.append([r.candidate for r in recs]) or {r.candidate: "1:1:x" for r in recs}))
    sought: list[int] = []
    real_wholes = samples.wholes
    monkeypatch.setattr(samples, "wholes", lambda *a: sought.append(1) or real_wholes(*a))
    picked = samples.pick(store, ["w"], 5, ())
    samples.featurize_missing(store, picked, "k", 1)
    assert featurized == [["c0", "c1"]]  # the 2 hot ones; c2-c4 left for an archive
    assert picked["w"].features == {"c0": "1:1:x", "c1": "1:1:x", "c2": "", "c3": "", "c4": ""}
    again = samples.pick(store, ["w"], 5, ())
    samples.featurize_missing(store, again, "k", 1)
    assert len(sought) == 1 and len(featurized) == 1  # nothing sought again


def test_a_retraining_after_the_round_never_fails_the_round(monkeypatch):
    """`train_pending` runs once a round is done (workers/host/app.py): a store away then, or
    a training that fails, is logged; the round's result stands."""
    from farm.store import StoreUnavailable
    from workers.metaschedule import costmodel

    class Away:
        def cost_model(self, mkey):
            raise StoreUnavailable("Redis is not reachable", subject="redis://127.0.0.1:1/0")

    monkeypatch.setattr(costmodel, "_PENDING", {"k1", "k2"})
    assert costmodel.train_pending(Away()) == []  # type: ignore[arg-type]
    assert costmodel._PENDING == set()
