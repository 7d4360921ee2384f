"""A round's cost model starts trained on the workload's stored records (not a cold start)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from farm.core.profiles import resolve_profile
from farm.store import StoredRecord, candidate_hash, open_store
from farm.store.cold import all_records
from tests.unit.test_cache import matmul_mod


@pytest.fixture(autouse=True, scope="module")
def cpu_intrinsics():
    """TuneContext imports TVM's whole intrinsic registry (30-40 s here) unless the CPU ones
    are registered first, as a worker does (farm/devices/intrinsics.py)."""
    from farm.devices.intrinsics import load_for

    load_for("llvm")

def seed(store, n: int = 64, count: int = 120):
    import tvm
    import tvm_ffi
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

    from farm.core.messages import TuneTask
    from farm.pipeline.extract import workload_key

    profile = resolve_profile("cpu-local", {})
    mod = matmul_mod(n)
    target = tvm.target.Target(profile.target_json())
    wk = workload_key(tvm_ffi.structural_hash(mod), profile.target_json(), profile.key)
    store.put_workload(TuneTask(name="matmul", workload_key=wk, weight=1,
                                mod_json=tvm.ir.save_json(mod), target=profile.target_json(),
                                device_key=profile.key))
    factors = [1, 2, 4, 8, 16, 32, 64]
    truth = {}
    for fi, fj, fk in itertools.islice(itertools.product(factors, repeat=3), count):
        sch = Schedule(mod)
        i, j, k = sch.get_loops(sch.get_sblock("C"))
        sch.split(i, factors=[None, fi])
        sch.split(j, factors=[None, fj])
        sch.split(k, factors=[None, fk])
        us = 10.0 + 100.0 / fj + 3.0 * abs(np.log2(fi) - 2)  # a made-up, learnable cost
        rec = TuningRecord(sch.trace, Workload(mod), [us / 1e6], target,
                           ArgInfo.from_prim_func(mod["main"])).as_json()
        cand = candidate_hash(rec)
        store.add_record(StoredRecord(workload_key=wk, candidate=cand, record=rec, run_us=us,
                                      job_id="seed"))
        truth[cand] = us
    return wk, mod, target, truth


def test_cost_model_is_trained_on_stored_records(tmp_path):
    from tvm.s_tir.meta_schedule import TuneContext
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

    from workers.metaschedule.costmodel import pretrained_cost_model

    # 32 whole records stay in the store, the rest is in the archive: it learns from all
    store = open_store("memory://", hot_records=32, archive=str(tmp_path / "archive"))
    wk, mod, target, truth = seed(store)
    assert len(store.records(wk)) <= 33 and store.spool_size() > 60
    workload = Workload(mod)
    model, learned = pretrained_cost_model(store, wk, workload, target)
    assert learned == len(truth) == store.record_count(wk) >= 100
    assert model.data_size == learned
    assert model.booster is not None  # trained: past XGBModel's 100 random warm-up samples
    recs = all_records(store, store.archive, wk)
    cands = [TuningRecord.from_json(r.record, workload).as_measure_candidate() for r in recs]
    scores = model.predict(TuneContext(mod=mod, target=target, task_name="t"), cands)
    # predictions are throughput-like (higher = faster): they must rank like the truth
    rank_pred = np.argsort(np.argsort(-np.asarray(scores)))
    rank_true = np.argsort(np.argsort([r.run_us for r in recs]))
    rho = np.corrcoef(rank_pred, rank_true)[0, 1]
    assert rho > 0.4, rho  # an untrained model predicts at random (rho ~ 0)


def test_no_records_gives_an_untrained_model():
    from tvm.s_tir.meta_schedule.database import Workload

    from workers.metaschedule.costmodel import pretrained_cost_model

    store = open_store("memory://")
    mod = matmul_mod(16)
    import tvm

    model, learned = pretrained_cost_model(store, "nothing", Workload(mod),
                                           tvm.target.Target({"kind": "llvm"}))
    assert learned == 0 and model.booster is None


def test_a_model_in_its_warm_up_keeps_samples_untrained_and_trains_on_all_when_it_ends():
    """`costmodel.learn`: below XGBModel's 100 warm-up samples it predicts at random whatever
    its booster, so the samples are kept without the retraining MetaSchedule's update does
    each batch; the batch that ends the warm-up trains it on every sample kept."""
    from tvm.s_tir.meta_schedule import TuneContext
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    from workers.metaschedule.costmodel import learn, pretrained_cost_model

    store = open_store("memory://", hot_records=1000)
    wk, mod, target, truth = seed(store, count=120)
    workload = Workload(mod)
    recs = sorted(store.records(wk), key=lambda r: r.candidate)
    assert len(recs) == 120
    held = recs[:60]  # the round's store holds 60 of them; the rest come as measured batches
    store2 = open_store("memory://", hot_records=1000)
    store2.put_workload(store.get_workload(wk))
    for r in held:
        store2.add_record(r)
    model, learned = pretrained_cost_model(store2, wk, workload, target)
    assert learned == 60 and model.data_size == 60
    assert model.booster is None  # in its warm-up: not trained (MetaSchedule's update would)
    assert model.adaptive_training and model.last_train_size == 0  # left as they were
    context = TuneContext(mod=mod, target=target, task_name="t")
    rest = [TuningRecord.from_json(r.record, workload).as_measure_candidate() for r in recs[60:]]
    results = [RunnerResult(run_secs=[r.run_us / 1e6], error_msg=None) for r in recs[60:]]
    learn(model, context, rest[:20], results[:20])
    assert model.data_size == 80 and model.booster is None
    learn(model, context, rest[20:], results[20:])  # 120: past the warm-up
    assert model.data_size == 120 and model.booster is not None
    assert model.last_train_size == 120  # trained on every sample kept
