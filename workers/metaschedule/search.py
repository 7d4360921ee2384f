"""MetaSchedule's evolutionary search, minus the candidates the store already holds.

TVM's EvolutionarySearch only avoids candidates measured in the current round
(its source says: "TODO: add records from the database to avoid re-measuring").
Across rounds, hosts and jobs it proposes stored candidates again, and each costs
a build and a phone run only to be thrown away as a duplicate; a culprit (a
candidate that crashed phones) would crash them again. This wrapper drops every
stored candidate before the builder sees it, and tells the search their stored
results instead, so the search learns from them as if measured.

A cold workload (nothing stored, so the cost model is untrained and predicts at random)
gets its first batch from plain random sampling of the design space (MetaSchedule's
ReplayTrace): evolving random samples under random scores is random sampling too, only
slower. One a borrowed model ranks gets the best ranked of a random sample (firstbatch.py).
From the second batch on, the evolutionary search runs as usual, starting from the first
batch's measurements. A cold workload seeded with its relatives' best schedules
(workers/metaschedule/transfer.py) measures those instead: the search then starts from them.

While a borrowed model ranks (the key's, corrected by the round's samples), the evolutionary
search does not score its population with it (unless `search_pool` is 0): scoring a schedule
means lowering it and computing its features (~20-40 ms a convolution), and the search scores
its whole population every genetic iteration, ~3x `search_population` schedules a batch: 20
CPU s of a 16-trial squeeze job against 5-8 s for a cold one (bench/learn.md), whose untrained
model scores at random without features. Instead the search evolves as a cold round's does
(mutants of the measured best and random samples, scored at random) and proposes
`search_pool` times the batch; the borrowed model ranks that pool once and the batch is its
best, with a random share (firstbatch.ranked_pick, as the ranked first batch). The model that
has not seen the workload picks among candidates and does not steer the evolution; its cost
is one feature extraction per pooled candidate.

TVM's default schedule of the workload (its TIR as lowered: what an untuned build runs) is
one candidate of the workload's first batch, once in the store's life (`baseline`): a random
schedule is often slower than it at small budgets (an instance norm: 93 us at its best of 2
random trials, the whole untuned model 14 us); with it, a best is never worse than untuned.

A stored record the farm does not trust (imported with `farm cache import`, or measured with
another TVM version) is not a known result: the search measures it when it proposes it, and
a round given `verify` records measures those first (the workload's best imported ones), so
an import becomes a job's choice only after a phone of the farm has timed it.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.cost_model import PyCostModel
from tvm.s_tir.meta_schedule.database import TuningRecord, Workload
from tvm.s_tir.meta_schedule.runner import RunnerResult
from tvm.s_tir.meta_schedule.search_strategy import PySearchStrategy, SearchStrategy

from farm.core.aliases import (
    JsonList,
    MeasureCandidate,
    Schedule,
    Target,
    TuneContext,
    TVMDatabase,
)
from farm.core.config import FarmConfig
from farm.core.messages import TuneTask
from farm.store import StoredRecord, candidate_hash
from farm.store.candidates import DEFAULT_SCHEDULE, DEFAULT_SOURCE
from farm.store.store import FAILED_RUN_SECS, ModelStore, RecordReader
from farm.tir.module import record_json
from workers.metaschedule.baseline import baseline_candidate
from workers.metaschedule.database import tuning_record
from workers.metaschedule.firstbatch import RankedSample, ranked_pick
from workers.metaschedule.inflight import InFlight, Proposed
from workers.metaschedule.transfer import seeds

log = logging.getLogger(__name__)
MAX_KNOWN_BATCHES = 8  # batches of only stored candidates in a row before the search gives up
VERIFY_TOP = 4  # untrusted stored records (imports) a round measures first, the best claimed


def record_of(cand: MeasureCandidate, workload: Workload, target: Target,
              run_secs: list[float] | None = None) -> JsonList:
    """The TuningRecord JSON of a measure candidate (what the store keeps and hashes)."""
    return record_json(TuningRecord(cand.sch.trace, workload, run_secs or [FAILED_RUN_SECS],
                                    target, cand.args_info))


@dataclass(frozen=True)
class TunedWorkload:
    """The workload a round tunes: its key in the store, MetaSchedule's `Workload` of it (its
    TIR) and the target. With a candidate they make the candidate's record."""

    key: str
    workload: Workload
    target: Target

    def record(self, cand: MeasureCandidate, run_secs: list[float] | None = None) -> JsonList:
        return record_of(cand, self.workload, self.target, run_secs)


# the first candidates of a new workload, made from the round's TuneContext (transfer.py),
# each with where it came from (its record's source: "transfer:<relative>")
Seeds = Callable[[TuneContext], list[tuple[MeasureCandidate, str]]]


@dataclass(frozen=True)
class SearchPlan:
    """What a round asks of its search, around MetaSchedule's own strategy:

    - `want`: new candidates to measure (0: as many as the search proposes); the search is
      given more trials than this (measure.py), as stored proposals use up its trials;
    - `cold`: a cold workload: its first batch sampled at random;
    - `sample`: ranked by a borrowed model: the first batch from so many random (firstbatch.py);
    - `pool`: ranked by a borrowed model: the evolutionary search, blind, proposes `pool` x
      a batch, of which the model picks the batch (0: the search ranks with the model);
    - `verify`: untrusted stored records to measure before the search starts (their own batch);
    - `seed`: makes the first candidates from the round's TuneContext (transfer.py);
    - `baseline`: TVM's default schedule is measured with the first batch;
    - `stop`: asked before every batch after the first: True ends the round there (handoff.py);
    - `tvm_version`: the TVM measuring (a record of another version is not trusted);
    - `origins`: filled with candidate hash -> source for the seeds (the store callback's).
    """

    want: int = 0
    cold: bool = False
    sample: int = 0
    pool: int = 0
    verify: list[StoredRecord] = field(default_factory=list)
    seed: Seeds | None = None
    baseline: bool = False
    stop: Callable[[], bool] | None = None
    tvm_version: str = ""
    origins: dict[str, str] | None = None


@dataclass(frozen=True)
class RoundFacts:
    """What a round knows when it starts its search: the new candidates it wants (`trials`),
    whether its workload has one possible schedule (`single`), what ranks its candidates
    (`ranked_by`: "" for a cold workload; `borrowed`: a model that has not learned from it,
    the key's) and how many records that model `learned` from."""

    trials: int
    single: bool = False
    learned: int = 0
    ranked_by: str = ""
    borrowed: bool = False


def to_verify(store: RecordReader, wk: str) -> list[StoredRecord]:
    """The stored records of `wk` a round measures first: valid records the farm does not
    trust (imported, or measured with another TVM) that claim to beat the best verified one,
    the best claims first (at most VERIFY_TOP)."""
    import tvm

    best = store.best(wk)
    claims = [r for r in store.records(wk) if r.valid and not r.trusted(tvm.__version__)
              and (best is None or r.run_us < best.run_us)]  # type: ignore[operator]
    claims.sort(key=lambda r: r.run_us)  # type: ignore[arg-type,return-value]
    return claims[:VERIFY_TOP]


def evolutionary(population: int = 128, iters: int = 2) -> SearchStrategy:
    """MetaSchedule's evolutionary search keeping `population` schedules per batch (the
    `search_population` setting). MetaSchedule's default is 512 for batches of 64 (tune_tir's
    num_trials_per_iter); a round's batches are 16, and the farm's default keeps the same 8
    schedules per candidate picked: the search of a batch costs a quarter (it evolves and
    ranks each schedule of the population `iters` times: the `search_iters` setting), which
    is what feeds 8-16 phones."""
    return SearchStrategy.create("evolutionary", population_size=population,
                                 init_min_unmeasured=min(50, population),
                                 genetic_num_iters=iters)


@derived_object
class Blind(PyCostModel):
    """Scores at random, as XGBModel does before it has warmed up, without features or
    MetaSchedule's global random state: what a pooled search evolves under."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.rng = np.random.default_rng(seed)

    def load(self, path: str) -> None:
        pass

    def save(self, path: str) -> None:
        pass

    def update(self, context: TuneContext, candidates: list[MeasureCandidate],
               results: list[RunnerResult]) -> None:
        pass

    def predict(self, context: TuneContext, candidates: list[MeasureCandidate]) -> np.ndarray:
        return self.rng.uniform(0.0, 1.0, len(candidates))


@derived_object
class StoreAwareSearch(PySearchStrategy):
    def __init__(self, store: RecordReader, tuned: TunedWorkload, plan: SearchPlan | None = None,
                 inner: SearchStrategy | None = None,
                 counts: dict[str, int] | None = None,
                 spent: dict[str, float] | None = None) -> None:
        super().__init__()
        plan = plan if plan is not None else SearchPlan()
        self.store = store
        self.tuned = tuned
        self.inner = inner if inner is not None else evolutionary()
        # shared with clones (tune_tir clones the strategy): "skipped" = stored candidates the
        # search proposed and nobody measured
        self.counts = counts if counts is not None else {"skipped": 0, "fresh": 0}
        # CPU seconds of the search's own steps (shared with clones), for the round's log:
        # making the seeds, and the borrowed model ranking pools
        self.spent = spent if spent is not None else {"seeds": 0.0, "ranking": 0.0}
        self.want, self.stop, self.tvm_version = plan.want, plan.stop, plan.tvm_version
        # proposed batches waiting for their results (up to two: the search runs one ahead)
        self.flights = InFlight()
        self.cold, self.sample = plan.cold, 0 if plan.cold else plan.sample
        # a cold workload's random first batch, or a ranked sample; dropped once measured
        self.first: SearchStrategy | RankedSample | None = SearchStrategy.create(
            "replay-trace") if plan.cold else RankedSample(self.sample) if self.sample else None
        self._first_out = False  # it proposed its batch: the next come from the evolutionary one
        self._inner_active = True  # pre_tuning turns it off when the first batch is all
        self.verify = list(plan.verify)  # measured first, then dropped
        # a borrowed model picks each batch from `pool` x the batch (pre_tuning: its `ranker`)
        self.pool, self.per_batch = 0 if plan.cold else plan.pool, 0
        self.ranker: Any = None  # the round's cost model, as TVM hands it to pre_tuning
        self.rng = random.Random(0)
        self.seed = plan.seed  # used once
        self.origins = plan.origins if plan.origins is not None else {}
        self.context: TuneContext | None = None
        # TVM's default schedule still to measure with the first batch (once per workload)
        self.baseline = plan.baseline

    def _initialize_with_tune_context(self, context: TuneContext) -> None:
        self.context = context
        self.rng = random.Random(int(context.rand_state))  # the round's seed: reproducible
        self.inner._initialize_with_tune_context(context)
        if self.first is not None:
            self.first._initialize_with_tune_context(context)

    def pre_tuning(self, max_trials: int, num_trials_per_iter: int,
                   design_spaces: list[Schedule], database: TVMDatabase | None = None,
                   cost_model: object = None) -> None:
        self.verify = self.verify[:max(0, min(max_trials, num_trials_per_iter))]
        max_trials -= len(self.verify)  # the verify batch is part of the round's trials
        rest = max_trials
        if self.first is not None and max_trials <= 0:
            self.first = None
        if self.first is not None:
            batch = min(max_trials, num_trials_per_iter)
            self.first.pre_tuning(batch, batch, design_spaces, database, cost_model)
            rest = max_trials - batch
        self._inner_active = rest > 0
        if rest <= 0:
            return
        if self.pool and cost_model is not None:  # the search evolves blind; the model picks
            self.ranker, self.per_batch = cost_model, num_trials_per_iter
            rest, num_trials_per_iter = rest * self.pool, num_trials_per_iter * self.pool
            cost_model = Blind(self.rng.randrange(2 ** 31))
        self.inner.pre_tuning(rest, num_trials_per_iter, design_spaces, database, cost_model)

    def post_tuning(self) -> None:
        self._end_first()
        if self._inner_active:
            self.inner.post_tuning()

    def _end_first(self) -> None:
        if self.first is not None:
            self.first.post_tuning()
            self.first = None

    def _propose(self) -> tuple[list[MeasureCandidate] | None, bool]:
        """The next batch of the search, and whether it is the random first batch."""
        if self.first is not None and not self._first_out:
            cands = self.first.generate_measure_candidates()
            if cands is not None:
                self._first_out = True
                return cands, True
            self._end_first()
        return (self.inner.generate_measure_candidates() if self._inner_active else None), False

    def _tell(self, cands: list[MeasureCandidate], results: list[RunnerResult],
              first: bool) -> None:
        if first and self.first is not None:
            self.first.notify_runner_results(cands, results)
            self._end_first()
        elif not first:
            self.inner.notify_runner_results(cands, results)

    def _sort(self, cands: list[MeasureCandidate], first: bool) -> Proposed:
        """The batch sorted: its stored candidates (their entries), its twins (a candidate the
        same batch proposed earlier: a random batch of a small design space often holds the
        same schedule twice), those a batch in flight measures; the rest is fresh. A stored
        record the farm does not trust is not known: it is measured again. (Its entry says:
        its whole record may be in the archive.)"""
        batch = Proposed(cands, first=first)
        seen: dict[str, int] = {}
        for i, cand in enumerate(cands):
            h = candidate_hash(self.tuned.record(cand))
            if h in seen:
                batch.twins[i] = seen[h]
                continue
            seen[h] = i
            entry = self.store.entry(self.tuned.key, h)
            if entry is not None and entry.trusted(self.tvm_version):
                batch.known[i] = entry
            elif self.flights.flying(h):
                batch.ahead[i] = h
            else:
                batch.fresh.append(i)
                batch.hashes[i] = h
        return batch

    def _own(self, cands: list[MeasureCandidate]) -> list[MeasureCandidate]:
        """A batch that is not the search's (imported records, seeds), sent as it is."""
        self.flights.add(Proposed(cands, fresh=list(range(len(cands))), own=True, hashes={
            i: candidate_hash(self.tuned.record(c)) for i, c in enumerate(cands)}))
        return cands

    def _seed_batch(self, make: Seeds, left: int) -> list[MeasureCandidate]:
        """The seeds (once): those the store does not hold, each once, at most `left`."""
        self.seed = None
        out, seen = [], set()
        c0 = time.process_time()
        try:
            made = make(self.context)
        except Exception as e:  # noqa: BLE001 - seeds are a head start, never a must
            log.warning("workload %s: no seeds from its relatives: %s", self.tuned.key, e)
            return []
        finally:
            self.spent["seeds"] += time.process_time() - c0
        for cand, origin in made:
            h = candidate_hash(self.tuned.record(cand))
            if h not in seen and not self.store.has_candidate(self.tuned.key, h):
                seen.add(h)
                out.append(cand)
                if len(out) <= left:
                    self.origins[h] = origin
        return out[:left]

    def _verify_batch(self) -> list[MeasureCandidate]:
        """The untrusted records to measure first, as measure candidates."""
        out = []
        for rec in self.verify:
            try:
                out.append(tuning_record(rec, self.tuned.workload)
                           .as_measure_candidate())
            except Exception as e:  # noqa: BLE001 - a record that does not apply is skipped
                log.warning("workload %s: stored record %s cannot be measured again: %s",
                            self.tuned.key, rec.candidate, e)
        self.verify = []
        return out

    def generate_measure_candidates(self) -> list[MeasureCandidate] | None:
        if self.verify:
            cands = self._verify_batch()
            if cands:
                log.info("workload %s: measuring %d imported or other-TVM records first",
                         self.tuned.key, len(cands))
                return self._own(cands)
        left = self.want - self.counts["fresh"] if self.want else 1
        if left <= 0:
            return None  # the round measured what it was asked for
        if self.seed is not None:
            lead = self._baseline()  # TVM's default schedule leads the first batch, seeded too
            seeded = self._seed_batch(self.seed, left - len(lead))
            if seeded:
                self.counts["fresh"] += len(lead) + len(seeded)
                self.counts["seeded"] = len(seeded)
                if self._inner_active:  # the evolutionary search starts from them, not at random
                    self._end_first()
                return self._own(lead + seeded)
            self.baseline = bool(lead)  # no seeds: it leads the search's first batch
        if self.stop is not None and self.counts["fresh"] and self.stop():  # after the first
            self.counts["handed_off"] = 1
            return None
        for _ in range(MAX_KNOWN_BATCHES):
            proposed, first = self._propose()
            if proposed is None:
                return None
            batch = self._sort(list(proposed), first)
            self.counts["skipped"] += len(batch.known) + len(batch.twins) + len(batch.ahead)
            if self.ranker is not None and not first:
                batch.fresh = self._picked(batch, min(left, self.per_batch) if self.want
                                           else self.per_batch)  # want 0: every batch whole
            if self.want:
                batch.fresh = batch.fresh[:left]  # the rest of the batch is told as not measured
            if batch.fresh:
                lead = self._baseline()
                if self.want and lead:
                    batch.fresh = batch.fresh[:left - len(lead)]
                batch.lead = len(lead)
                self.counts["fresh"] += len(batch.fresh) + len(lead)
                self.flights.add(batch)
                return lead + [batch.cands[i] for i in batch.fresh]
            self._tell(batch.cands, self.flights.results(batch, []), first)
        log.info("workload %s: the search proposed only stored candidates %d times in a row; "
                 "ending the round", self.tuned.key, MAX_KNOWN_BATCHES)
        return None

    def _picked(self, batch: Proposed, n: int) -> list[int]:
        """The `n` fresh candidates of a pooled batch the borrowed model picks (its best, with
        a random share); the rest is told to the search as not measured."""
        if len(batch.fresh) <= n:
            return batch.fresh
        c0 = time.process_time()
        scores = self.ranker.predict(self.context, [batch.cands[i] for i in batch.fresh])
        self.spent["ranking"] += time.process_time() - c0
        return [batch.fresh[i] for i in ranked_pick(list(scores), n, self.rng)]

    def _baseline(self) -> list[MeasureCandidate]:
        """TVM's default schedule, once, unless the store has measured it already."""
        if not self.baseline:
            return []
        self.baseline = False
        try:
            if self.store.has_candidate(self.tuned.key, DEFAULT_SCHEDULE):
                return []
            cand = baseline_candidate(self.tuned.workload, self.tuned.target)
            h = candidate_hash(self.tuned.record(cand))
            if h != DEFAULT_SCHEDULE:  # a GPU's: marked by its record's source
                if self.store.has_candidate(self.tuned.key, h):
                    return []
                self.origins[h] = DEFAULT_SOURCE
        except Exception as e:  # noqa: BLE001 - a comparison, never a must
            log.warning("workload %s: its default schedule is not measured: %s",
                        self.tuned.key, e)
            return []
        return [cand]

    def notify_runner_results(self, measure_candidates: list[MeasureCandidate],
                              results: list[RunnerResult]) -> None:
        batch = self.flights.pop()
        full = self.flights.results(batch, list(results)[batch.lead:])  # lead: not the search's
        if not batch.own:  # the search did not propose an own batch: nothing to tell it
            self._tell(batch.cands, full, batch.first)

    def clone(self) -> StoreAwareSearch:
        """A twin sharing the counts, with what is left of the plan."""
        left = SearchPlan(want=self.want, cold=self.cold, sample=self.sample, pool=self.pool,
                          verify=self.verify,
                          seed=self.seed, baseline=self.baseline, stop=self.stop,
                          tvm_version=self.tvm_version, origins=self.origins)
        return StoreAwareSearch(self.store, self.tuned, left, self.inner.clone(), self.counts,
                                self.spent)


def round_search(store: ModelStore, task: TuneTask, tuned: TunedWorkload, facts: RoundFacts,
                 config: FarmConfig, stop: Callable[[], bool] | None = None,
                 origins: dict[str, str] | None = None) -> StoreAwareSearch:
    """A round's search: MetaSchedule's evolutionary search minus stored candidates; a cold
    workload's first batch at random, a new one's first its relatives' best schedules
    (workers/metaschedule/transfer.py), imported records verified first; TVM's default schedule
    with the first batch (`baseline_candidate`)."""
    import tvm

    single = facts.single
    plan = SearchPlan(
        want=facts.trials,
        cold=not facts.ranked_by and not single,  # ... is sampled at random
        sample=config.first_sample if facts.borrowed and not single else 0,
        pool=config.search_pool if facts.borrowed and not single else 0,
        verify=[] if single else to_verify(store, task.workload_key),
        seed=None if single or facts.learned else seeds(store, task, config.transfer_seeds),
        baseline=not single,
        stop=stop, tvm_version=tvm.__version__, origins=origins)
    return StoreAwareSearch(store, tuned, plan, inner=evolutionary(config.search_population,
                                                                  config.search_iters))

