"""A round's cost-model features, computed once per schedule.

MetaSchedule's cost models extract a candidate's features (`PerStoreFeature`: its TIR lowered,
then its loops and buffers described) every time they score or learn from it, and the
evolutionary search scores its whole population every genetic iteration: the schedules that
survive an iteration, the mutants that come out the same as one scored before, and the
measured best the search starts each batch from are lowered again and again (~20-40 ms a
convolution). `CachedFeatures` keeps each schedule's features by its TIR's structural hash
for the round, so a schedule is lowered once. The features are the same as before: the
wrapped extractor computes every one of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.feature_extractor import PyFeatureExtractor

from farm.core.aliases import MeasureCandidate, TuneContext

if TYPE_CHECKING:
    from tvm.s_tir.meta_schedule.feature_extractor import FeatureExtractor

LIMIT = 8192  # schedules kept (a round scores a few hundred a batch); beyond, it starts over


@derived_object
class CachedFeatures(PyFeatureExtractor):
    """MetaSchedule's per-store features (`inner`, default `PerStoreFeature()`, what XGBModel
    uses), computed once per schedule (its module's structural hash) for this extractor's life
    (one round). `hits` and `computed` count the candidates served each way."""

    def __init__(self, inner: FeatureExtractor | None = None) -> None:
        from tvm.s_tir.meta_schedule.feature_extractor import PerStoreFeature

        super().__init__()
        self.inner = inner if inner is not None else PerStoreFeature()
        self.cache: dict[int, object] = {}
        self.hits = 0
        self.computed = 0

    def extract_from(self, context: TuneContext,
                     candidates: list[MeasureCandidate]) -> list[object]:
        import tvm_ffi

        hashes = [int(tvm_ffi.structural_hash(c.sch.mod)) for c in candidates]
        if len(self.cache) + len(hashes) > LIMIT:
            self.cache.clear()  # a bound on the round's memory: start over
        todo: dict[int, MeasureCandidate] = {}
        for h, cand in zip(hashes, candidates, strict=True):
            if h not in self.cache:
                todo.setdefault(h, cand)
        if todo:
            found = self.inner.extract_from(context, list(todo.values()))
            self.cache.update(zip(todo, found, strict=True))
        self.computed += len(todo)
        self.hits += len(candidates) - len(todo)
        return [self.cache[h] for h in hashes]
