"""A round's cost-model features computed once per schedule (workers/metaschedule/features.py): the
same features as MetaSchedule's own extractor, a schedule seen again not lowered again."""

from __future__ import annotations

import numpy as np


def candidates():
    """Three candidates of the probe's matmul: its unscheduled TIR twice, a tiled one once
    (the CPU intrinsics loaded as a worker loads them: TuneContext's own import of them all
    takes 15-40 s)."""
    import tvm

    from workers.round.context import preload

    preload()
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate

    from farm.devices.probe import candidate, workload

    mod = workload()
    args = ArgInfo.from_prim_func(mod["main"])
    plain = tvm.s_tir.Schedule(mod)
    tiled = tvm.s_tir.Schedule(candidate(mod))
    again = tvm.s_tir.Schedule(workload())  # another object, the same TIR
    return mod, [MeasureCandidate(s, args) for s in (plain, tiled, again)]


def test_each_schedule_is_featurized_once_and_like_metaschedules_own():
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.feature_extractor import PerStoreFeature

    from workers.metaschedule.features import CachedFeatures

    mod, cands = candidates()
    context = ms.TuneContext(mod=mod, target=tvm.target.Target("llvm"), num_threads=1)
    cached = CachedFeatures()
    got = [x.numpy() for x in cached.extract_from(context, cands)]
    want = [x.numpy() for x in PerStoreFeature().extract_from(context, cands)]
    assert len(got) == 3 and all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    assert (cached.computed, cached.hits) == (2, 1)  # the plain TIR once
    again = [x.numpy() for x in cached.extract_from(context, cands[1:])]
    assert all(np.array_equal(g, w) for g, w in zip(again, want[1:], strict=True))
    assert (cached.computed, cached.hits) == (2, 3)
    assert not np.array_equal(got[0], got[1])  # a schedule's own features


def test_xgboost_model_learns_and_predicts_through_the_cache():
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.cost_model import XGBModel
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    from workers.metaschedule.features import CachedFeatures

    mod, cands = candidates()
    context = ms.TuneContext(mod=mod, target=tvm.target.Target("llvm"), num_threads=1)
    extractor = CachedFeatures()
    model = XGBModel(num_tuning_cores=1, extractor=extractor, num_warmup_samples=0)
    model.update(context, cands, [RunnerResult([1e-4], None), RunnerResult([2e-5], None),
                                  RunnerResult([1e-4], None)])
    scores = model.predict(context, cands)
    assert len(scores) == 3 and extractor.computed == 2 and extractor.hits == 4  # 1 + 3
