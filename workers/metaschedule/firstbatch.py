"""The first batch of a round that a borrowed model ranks: a ranked random sample.

A new workload whose relatives the key's cost model ranks well (workers/metaschedule/costmodel.py:
`round_model`) has no measurement of its own yet. MetaSchedule's evolutionary search would
make its first batch as it makes every batch: sample an initial population, evolve it for
`search_iters` genetic iterations under the model, pick the best predicted. On a 3x3
convolution that costs ~5.4 CPU s a batch of 16 against ~0.24 s for a cold round's random
batch (bench/cpu.md, `bench/features.py --first-batch`), most of a warm job's longer wall
(issue 47), and it leans the whole batch on a model that has never seen this workload.

Here the first batch is `sample` random schedules of the design space (MetaSchedule's
ReplayTrace, as a cold round's batch), ranked by the model once: the batch is the best
predicted, a few (MetaSchedule's epsilon-greedy share, at least one) picked at random from
the rest, so a model that ranks this workload wrong still leaves the search a random
start. From the second batch on, the evolutionary search runs as usual from the batch's
measurements. `first_sample = 0` (FARM_FIRST_SAMPLE) turns it off.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence

import numpy as np
from tvm.s_tir.meta_schedule.runner import RunnerResult
from tvm.s_tir.meta_schedule.search_strategy import SearchStrategy

from farm.core.aliases import MeasureCandidate, Schedule, TuneContext, TVMDatabase

log = logging.getLogger(__name__)
EPS_GREEDY = 0.05  # MetaSchedule's evolutionary search's share of random picks


def ranked_pick(scores: Sequence[float], batch: int, rng: random.Random) -> list[int]:
    """The indices of a batch: the `batch - k` best scores (ties in sample order) and `k`
    random others, k = EPS_GREEDY of the batch, at least 1 when the batch has room for it."""
    if len(scores) <= batch:
        return list(range(len(scores)))
    order = [int(i) for i in np.argsort(-np.asarray(scores, dtype=float), kind="stable")]
    explore = max(1, round(batch * EPS_GREEDY)) if batch > 1 else 0
    best, rest = order[:batch - explore], order[batch - explore:]
    return best + rng.sample(rest, explore)


class RankedSample:
    """A strategy for one batch (StoreAwareSearch's `first`): `sample` random schedules, the
    batch of them the cost model ranks best, with a random share."""

    def __init__(self, sample: int) -> None:
        self.replay = SearchStrategy.create("replay-trace")
        self.sample = sample
        self.batch = 0
        self.context: TuneContext | None = None
        self.model: object = None
        self.rng = random.Random(0)

    def _initialize_with_tune_context(self, context: TuneContext) -> None:
        self.context = context
        self.rng = random.Random(int(context.rand_state))  # the round's seed: reproducible
        self.replay._initialize_with_tune_context(context)

    def pre_tuning(self, max_trials: int, num_trials_per_iter: int,
                   design_spaces: list[Schedule], database: TVMDatabase | None = None,
                   cost_model: object = None) -> None:
        self.batch = min(max_trials, num_trials_per_iter)
        n = max(self.sample, self.batch)
        self.model = cost_model
        self.replay.pre_tuning(n, n, design_spaces, database, cost_model)

    def generate_measure_candidates(self) -> list[MeasureCandidate] | None:
        cands = self.replay.generate_measure_candidates()
        if cands is None:
            return None
        cands = list(cands)
        if self.model is None or len(cands) <= self.batch:
            return cands[:self.batch]
        scores = self.model.predict(self.context, cands)  # type: ignore[attr-defined]
        return [cands[i] for i in ranked_pick(list(scores), self.batch, self.rng)]

    def notify_runner_results(self, cands: list[MeasureCandidate],
                              results: list[RunnerResult]) -> None:
        """ReplayTrace only moves on to its next batch (there is none: its one batch is all)."""
        self.replay.notify_runner_results(cands, results)

    def post_tuning(self) -> None:
        self.replay.post_tuning()
