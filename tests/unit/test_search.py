"""The store-aware search: a candidate the store holds never reaches a builder or a phone again
(real MetaSchedule search, builder and runner on this CPU)."""

from __future__ import annotations

import pytest

from farm.store import open_store
from tests.helpers import tvm_children_without_torch
from tests.unit.test_cache import matmul_mod


@pytest.fixture(autouse=True, scope="module")
def cpu_intrinsics():
    """TuneContext imports TVM's whole intrinsic registry (30-40 s here) unless the CPU ones
    are registered first, as a worker does (farm/devices/intrinsics.py)."""
    from farm.devices.intrinsics import load_for

    load_for("llvm")

BUILDER: dict = {}  # one warm build process for both runs (a fresh pool costs ~20 s a batch)
RUNNER: dict = {}  # one local runner for the module (each starts a process that imports TVM)


def local_runner():
    """MetaSchedule's LocalRunner on this CPU, shared by the module's loops: one run of at
    least 1 ms a candidate (these tests check what the loop and store do with the times)."""
    from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, LocalRunner

    if "r" not in RUNNER:
        with tvm_children_without_torch():
            RUNNER["r"] = LocalRunner(evaluator_config=EvaluatorConfig(
                number=1, repeat=1, min_repeat_ms=1, enable_cpu_cache_flush=False))
    return RUNNER["r"]


class CountingInner:
    """TVM's EvolutionarySearch, counting what it is asked."""

    def __init__(self, spy=None):
        from workers.metaschedule.search import evolutionary

        # the farm's search, small: these tests check the loop around it, not its finds
        self.real = evolutionary(population=64, iters=1)
        self.batches, self.max_trials, self.spy = 0, None, spy

    def _initialize_with_tune_context(self, context):
        self.real._initialize_with_tune_context(context)

    def pre_tuning(self, max_trials, *args):
        self.max_trials, self.args = max_trials, args
        self.real.pre_tuning(max_trials, *args)

    def post_tuning(self):
        self.real.post_tuning()

    def generate_measure_candidates(self):
        cands = self.real.generate_measure_candidates()
        self.batches += cands is not None
        if self.spy is not None and cands is not None:
            self.spy.events.append("gen")
        return cands

    def notify_runner_results(self, cands, results):
        if self.spy is not None:
            self.spy.events.append("tell")
        self.real.notify_runner_results(cands, results)

    def clone(self):
        return self



class Spy:
    """The order of a loop's events: the search asked for a batch ("gen"), a batch sent to
    the runner ("run"), a batch's results told to the search ("tell")."""

    def __init__(self):
        self.events = []


class SpyRunner:
    """MetaSchedule's LocalRunner, noting when a batch is sent."""

    def __init__(self, spy):
        self.spy, self.real = spy, local_runner()

    def run(self, inputs):
        self.spy.events.append("run")
        return self.real.run(inputs)


def tune(store, wk, mod, target, trials, job, cold=False, inner=None, ahead=True, spy=None):
    """A round's loop (workers/round/loop.py) on this CPU: the search `ahead` or not."""
    from tvm.s_tir import meta_schedule as ms

    from workers.metaschedule.builder import WarmBuilder
    from workers.metaschedule.callback import Provenance, RoundCounters, StoreCallback
    from workers.metaschedule.database import StoreDatabase
    from workers.metaschedule.search import SearchPlan, StoreAwareSearch, TunedWorkload
    from workers.round.loop import Loop, OnPhones

    database = StoreDatabase(store, wk, mod)
    tuned = TunedWorkload(wk, database.workload, target)
    search = StoreAwareSearch(store, tuned, SearchPlan(cold=cold), inner=inner)
    counters = RoundCounters()
    ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply",
                         search_strategy=search, task_name="main", rand_state=7, num_threads=1)
    runner = SpyRunner(spy) if spy is not None else local_runner()
    with tvm_children_without_torch():
        builder = BUILDER.setdefault("b", WarmBuilder(1, 60, 64))
    loop = Loop(ctx, builder, OnPhones(runner), ms.CostModel.create("random"),
                StoreCallback(store, tuned, Provenance(job, "here"), counters), ahead=ahead)
    loop.run(max_trials=trials, per_batch=8, database=database)
    return counters, search


def test_stored_candidates_are_not_measured_again_and_a_cold_workload_starts_at_random():
    import tvm

    from farm.core.messages import TuneTask

    store = open_store("memory://")
    mod = matmul_mod(32)
    target = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    store.put_workload(TuneTask(name="mm", workload_key="wk", weight=1,
                                mod_json=tvm.ir.save_json(mod), target={"kind": "llvm"},
                                device_key="cpu-local"))
    # A cold workload (nothing stored): the first batch is sampled at random, the rest of
    # the round is TVM's evolutionary search, starting from that batch.
    inner = CountingInner()
    first, _ = tune(store, "wk", mod, target, 16, "j1", cold=True, inner=inner)
    assert inner.max_trials == 8 and inner.batches == 1
    assert first.new == store.record_count("wk") >= 12  # a random sample may repeat one...
    assert first.duplicates == 0  # ...which is measured once
    assert first.valid == first.new
    # Another round, warm from the store (its search starts from the stored best).
    second, search = tune(store, "wk", mod, target, 8, "j2")
    assert second.duplicates == 0  # nothing already stored was built and measured again
    assert store.job_measured("j2").get("wk", 0) == second.new >= 1
    assert store.record_count("wk") == first.new + second.new
    # the store's own count of phone measurements: none was of a stored candidate
    assert store.job_counts("j1")["wk"]["duplicates"] == 0
    assert store.job_counts("j2")["wk"]["duplicates"] == 0


@pytest.mark.parametrize("ahead", [True, False])
def test_the_next_batch_is_searched_while_the_last_is_measured_and_results_told_in_order(ahead):
    """With the search ahead, batch k+1 is proposed (and built) before batch k's results are
    told, and every batch's results are told in the order the batches went out; without it,
    MetaSchedule's own order. Either way each candidate is measured once."""
    import tvm

    store = open_store("memory://")
    mod = matmul_mod(32)
    target = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    spy = Spy()
    inner = CountingInner(spy)
    counters, _ = tune(store, "wk", mod, target, 24, "j", inner=inner, ahead=ahead, spy=spy)
    if ahead:  # batch k+1 asked for before batch k's results are told; told in order
        assert spy.events == ["gen", "run", "gen", "tell", "run", "gen", "tell", "run", "tell"]
    else:
        assert spy.events == ["gen", "run", "tell"] * 3
    assert counters.new == store.record_count("wk") == 24 and counters.duplicates == 0
    assert store.job_counts("j")["wk"]["duplicates"] == 0


class FakeInner:
    """Stands in for TVM's EvolutionarySearch: proposes fixed batches, records notifications."""

    def __init__(self, batches):
        self.batches = list(batches)
        self.notified = []

    def generate_measure_candidates(self):
        return self.batches.pop(0) if self.batches else None

    def notify_runner_results(self, cands, results):
        self.notified.append((list(cands), list(results)))


def candidates(mod, count):
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate

    out = []
    for f in [1, 2, 4, 8, 16, 32][:count]:
        sch = Schedule(mod)
        sch.split(sch.get_loops(sch.get_sblock("C"))[0], factors=[None, f])
        out.append(MeasureCandidate(sch, ArgInfo.from_prim_func(mod["main"])))
    return out


def first_one_stored(count):
    """A memory store holding the first of `count` candidates of a matmul (5 us), the
    workload, its target and the candidates."""
    import tvm
    from tvm.s_tir.meta_schedule.database import Workload

    from farm.store import StoredRecord, candidate_hash
    from workers.metaschedule.search import record_of

    store = open_store("memory://")
    mod = matmul_mod(32)
    workload, target = Workload(mod), tvm.target.Target({"kind": "llvm"})
    c = candidates(mod, count)
    rec = record_of(c[0], workload, target, [5e-6])
    store.add_record(StoredRecord(workload_key="wk", candidate=candidate_hash(rec), record=rec,
                                  run_us=5.0))
    return store, workload, target, c


def test_the_search_never_hands_out_a_stored_candidate():
    import tvm
    from tvm.s_tir.meta_schedule.database import Workload
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    from farm.store import StoredRecord, candidate_hash
    from workers.metaschedule.search import (
        MAX_KNOWN_BATCHES,
        StoreAwareSearch,
        TunedWorkload,
        record_of,
    )

    store = open_store("memory://")
    mod = matmul_mod(32)
    workload, target = Workload(mod), tvm.target.Target({"kind": "llvm"})
    c = candidates(mod, 4)

    def stored(cand, us, err=None):
        rec = record_of(cand, workload, target, None if err else [us * 1e-6])
        store.add_record(StoredRecord(workload_key="wk", candidate=candidate_hash(rec),
                                      record=rec, run_us=None if err else us, error_class=err))

    stored(c[0], 5.0)
    stored(c[2], 0.0, err="culprit")  # crashed phones: must never be handed out again
    inner = FakeInner([[c[0], c[1], c[2], c[3]], [c[0], c[2]], [c[0]]])
    search = StoreAwareSearch(store, TunedWorkload("wk", workload, target), inner=inner)
    fresh = search.generate_measure_candidates()
    assert [candidate_hash(record_of(x, workload, target)) for x in fresh] == [
        candidate_hash(record_of(x, workload, target)) for x in (c[1], c[3])]
    search.notify_runner_results(fresh, [RunnerResult([1e-6], None), RunnerResult([2e-6], None)])
    cands, results = inner.notified[0]  # the search hears of all four, in its own order
    assert len(cands) == 4
    secs = [r.run_secs and round(float(r.run_secs[0]) * 1e6, 3) for r in results]
    assert secs == [5.0, 1.0, None, 2.0]
    assert search.counts["skipped"] == 2
    # batches of stored candidates only are answered from the store, then the search ends
    assert search.generate_measure_candidates() is None
    assert search.counts["skipped"] == 5 and len(inner.notified) == 3
    endless = FakeInner([[c[0]]] * (MAX_KNOWN_BATCHES + 5))
    assert StoreAwareSearch(store, TunedWorkload("wk", workload, target),
                            inner=endless).generate_measure_candidates() is None
    assert len(endless.notified) == MAX_KNOWN_BATCHES




def test_a_candidate_twice_in_one_batch_is_measured_once():
    import tvm
    from tvm.s_tir.meta_schedule.database import Workload
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    from farm.store import candidate_hash
    from workers.metaschedule.search import StoreAwareSearch, TunedWorkload, record_of

    store = open_store("memory://")
    mod = matmul_mod(32)
    workload, target = Workload(mod), tvm.target.Target({"kind": "llvm"})
    c = candidates(mod, 2)
    inner = FakeInner([[c[0], c[1], c[0], c[0]]])  # a random batch of a small design space
    search = StoreAwareSearch(store, TunedWorkload("wk", workload, target), inner=inner)
    fresh = search.generate_measure_candidates()
    key = [candidate_hash(record_of(x, workload, target)) for x in fresh]
    assert key == [candidate_hash(record_of(x, workload, target)) for x in (c[0], c[1])]
    search.notify_runner_results(fresh, [RunnerResult([3e-6], None), RunnerResult([4e-6], None)])
    cands, results = inner.notified[0]  # the search hears of all four: twins share a result
    assert [round(float(r.run_secs[0]) * 1e6, 3) for r in results] == [3.0, 4.0, 3.0, 3.0]
    assert search.counts["skipped"] == 2


def test_a_round_measures_the_new_candidates_it_was_asked_for_and_stops_when_told():
    """Stored proposals do not use up a round's trials (it measures `want` new candidates),
    and a `stop` hook (workers/round/handoff.py) is asked before every batch after the first."""
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    from workers.metaschedule.search import SearchPlan, StoreAwareSearch, TunedWorkload

    store, workload, target, c = first_one_stored(6)
    inner = FakeInner([[c[0], c[1], c[2]], [c[3], c[4], c[5]], [c[5]]])
    asked = []
    tuned = TunedWorkload("wk", workload, target)
    search = StoreAwareSearch(store, tuned, SearchPlan(
        want=3, stop=lambda: asked.append(1) is not None), inner=inner)  # never stops
    first = search.generate_measure_candidates()
    assert len(first) == 2 and not asked  # c1, c2 (c0 is stored); no hook before the first
    search.notify_runner_results(first, [RunnerResult([1e-6], None)] * 2)
    second = search.generate_measure_candidates()
    assert len(second) == 1 and len(asked) == 1  # one more new candidate is all it wants
    search.notify_runner_results(second, [RunnerResult([2e-6], None)])
    _, results = inner.notified[1]  # the search hears of the three: two as not measured
    assert [r.run_secs is None for r in results] == [False, True, True]
    assert search.generate_measure_candidates() is None  # 3 new measured: the round is done
    assert search.counts["fresh"] == 3 and "handed_off" not in search.counts
    # a hook that says stop ends the round before its second batch
    told = StoreAwareSearch(store, tuned, SearchPlan(want=8, stop=lambda: True),
                            inner=FakeInner([[c[1], c[2]], [c[3], c[4]]]))
    batch = told.generate_measure_candidates()
    told.notify_runner_results(batch, [RunnerResult([1e-6], None)] * len(batch))
    assert told.generate_measure_candidates() is None and told.counts["handed_off"] == 1


def test_seeds_are_measured_first_once_and_not_told_to_the_search():
    """A new workload's relatives' schedules (workers/metaschedule/transfer.py) are the round's first batch:
    those the store does not hold, each once, counted as new candidates of the round; the
    search is not told of them (it did not propose them: the store's best is where it starts),
    and the random first batch of a cold workload is dropped for them."""
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    from farm.store import candidate_hash
    from workers.metaschedule.search import SearchPlan, StoreAwareSearch, TunedWorkload, record_of

    store, workload, target, c = first_one_stored(4)
    asked = []
    inner = FakeInner([[c[3]]])
    search = StoreAwareSearch(store, TunedWorkload("wk", workload, target), SearchPlan(
        want=8, seed=lambda context: asked.append(context) or [
            (x, f"transfer:r{i}") for i, x in enumerate([c[0], c[1], c[1], c[2]])]),
        inner=inner)
    search.first = object()  # stands for a cold workload's random first batch
    search._end_first = lambda: setattr(search, "first", None)
    search._inner_active = True
    seeded = search.generate_measure_candidates()
    hashes = [candidate_hash(record_of(x, workload, target)) for x in seeded]
    assert hashes == [candidate_hash(record_of(x, workload, target)) for x in (c[1], c[2])]
    assert len(asked) == 1 and search.counts["fresh"] == 2 and search.counts["seeded"] == 2
    assert search.first is None  # the evolutionary search starts from the seeds
    assert search.origins == dict(zip(hashes, ["transfer:r1", "transfer:r3"], strict=True))
    search.notify_runner_results(seeded, [RunnerResult([1e-6], None)] * 2)
    assert inner.notified == []
    assert search.generate_measure_candidates() == [c[3]] and len(asked) == 1  # once


def test_a_seeded_first_batch_is_led_by_the_default_schedule():
    """With seeds, TVM's default schedule still leads the first batch (a round of 4 trials
    with relatives is all seeds: without it the task's best could be slower than untuned)."""
    from farm.store import candidate_hash
    from farm.store.candidates import DEFAULT_SCHEDULE
    from workers.metaschedule.search import SearchPlan, StoreAwareSearch, TunedWorkload, record_of

    store, workload, target, c = first_one_stored(4)
    search = StoreAwareSearch(store, TunedWorkload("wk", workload, target), SearchPlan(
        want=3, baseline=True, seed=lambda context: [(x, "transfer:r") for x in c[1:]]),
        inner=FakeInner([]))
    first = search.generate_measure_candidates()
    hashes = [candidate_hash(record_of(x, workload, target)) for x in first]
    assert hashes[0] == DEFAULT_SCHEDULE and len(hashes) == 3, hashes
    assert search.counts["fresh"] == 3 and search.counts["seeded"] == 2
    assert DEFAULT_SCHEDULE not in search.origins and len(search.origins) == 2


def test_the_default_schedule_is_measured_with_the_first_batch_once_per_workload():
    """TVM's default schedule (the function unscheduled) leads the first batch, counts as one
    of the round's new candidates and is not told to the search (it did not propose it); once
    the store holds its record, no later round measures it again."""
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    from farm.store import StoredRecord, candidate_hash
    from farm.store.candidates import DEFAULT_SCHEDULE
    from workers.metaschedule.search import (
        SearchPlan,
        StoreAwareSearch,
        TunedWorkload,
        baseline_candidate,
        record_of,
    )

    store, workload, target, c = first_one_stored(6)
    base = candidate_hash(record_of(baseline_candidate(workload), workload, target))
    inner = FakeInner([[c[0], c[1], c[2], c[3]], [c[4], c[5]]])
    tuned = TunedWorkload("wk", workload, target)
    search = StoreAwareSearch(store, tuned, SearchPlan(want=3, baseline=True), inner=inner)
    first = search.generate_measure_candidates()
    hashes = [candidate_hash(record_of(x, workload, target)) for x in first]
    assert hashes == [base] + [candidate_hash(record_of(x, workload, target)) for x in c[1:3]]
    assert hashes[0] == DEFAULT_SCHEDULE and search.counts["fresh"] == 3
    search.notify_runner_results(first, [RunnerResult([9e-6], None), RunnerResult([1e-6], None),
                                         RunnerResult([2e-6], None)])
    cands, results = inner.notified[0]  # the search's four, with their own results
    assert len(cands) == 4
    assert [r.run_secs and round(float(r.run_secs[0]) * 1e6, 3) for r in results] == [
        5.0, 1.0, 2.0, None]
    assert search.generate_measure_candidates() is None  # 3 new: the round is done
    rec = record_of(first[0], workload, target, [9e-6])
    store.add_record(StoredRecord(workload_key="wk", candidate=candidate_hash(rec), record=rec,
                                  run_us=9.0))
    again = StoreAwareSearch(store, tuned, SearchPlan(want=2, baseline=True),
                             inner=FakeInner([[c[4], c[5]]]))
    assert [candidate_hash(record_of(x, workload, target))
            for x in again.generate_measure_candidates()] == [
        candidate_hash(record_of(x, workload, target)) for x in c[4:]]


def test_a_stored_record_the_evolutionary_search_cannot_mutate_is_not_a_starting_point():
    """A sampled schedule whose postprocessing is not marked (the farm's first transferred
    seeds) made TVM's evolutionary search fail whole rounds; the store's database leaves it
    out of the search's top records, and keeps the marked ones."""
    import tvm
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule import TuneContext

    from farm.store import StoredRecord, candidate_hash
    from workers.metaschedule.database import StoreDatabase
    from workers.metaschedule.search import record_of

    store, workload, target, c = first_one_stored(2)
    context = TuneContext(mod=workload.mod, target=tvm.target.Target(
        {"kind": "llvm", "num-cores": 1}), space_generator="post-order-apply",
        task_name="unmarked", num_threads=1)
    space = context.space_generator.generate_design_space(workload.mod)[0]
    sch = Schedule(workload.mod)
    space.trace.apply_to_schedule(sch, remove_postproc=True)
    for post in context.space_generator.postprocs:  # no enter_postproc(): unmarked
        post.apply(sch)
    for cand, us in ((sch, 1.0), (c[1].sch, 2.0)):
        rec = record_of(type(c[1])(cand, c[1].args_info), workload, target, [us * 1e-6])
        store.add_record(StoredRecord(workload_key="wk", candidate=candidate_hash(rec),
                                      record=rec, run_us=us))
    top = StoreDatabase(store, "wk", workload.mod).get_top_k(workload, 10)
    assert [float(r.run_secs[0]) * 1e6 for r in top] == pytest.approx([2.0, 5.0]), top


def ranked_round(plan):
    """A round of a 32x32 matmul, 16 new candidates in batches of 8, its search planned by
    `plan` and ranked by a model whose score is a function of the candidate's hash: (the
    inner search, each predict's (hashes, scores), each measured batch's hashes, counters)."""
    import numpy as np
    import tvm
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.cost_model import PyCostModel

    from farm.core.messages import TuneTask
    from farm.store import candidate_hash
    from workers.metaschedule.builder import WarmBuilder
    from workers.metaschedule.callback import Provenance, RoundCounters, StoreCallback
    from workers.metaschedule.database import StoreDatabase
    from workers.metaschedule.search import StoreAwareSearch, TunedWorkload, record_of
    from workers.round.loop import Loop, OnPhones

    store, mod = open_store("memory://"), matmul_mod(32)
    target = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    store.put_workload(TuneTask(name="mm", workload_key="wk", weight=1,
                                mod_json=tvm.ir.save_json(mod), target={"kind": "llvm"},
                                device_key="cpu-local"))
    database = StoreDatabase(store, "wk", mod)
    tuned = TunedWorkload("wk", database.workload, target)
    scored: list[tuple[list[str], list[float]]] = []  # each predict: candidates, scores

    @derived_object
    class Scores(PyCostModel):  # a model whose scores are a function of the candidate
        def load(self, path): pass
        def save(self, path): pass
        def update(self, context, candidates, results): pass

        def predict(self, context, candidates):
            hashes = [candidate_hash(record_of(c, tuned.workload, target)) for c in candidates]
            scores = [int(h[:8], 16) / 2 ** 32 for h in hashes]
            scored.append((hashes, scores))
            return np.array(scores)

    inner = CountingInner()
    search = StoreAwareSearch(store, tuned, plan, inner=inner)
    ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply",
                         search_strategy=search, task_name="main", rand_state=7, num_threads=1)
    with tvm_children_without_torch():
        builder = BUILDER.setdefault("b", WarmBuilder(1, 60, 64))
    sent: list[list[str]] = []
    counters = RoundCounters()
    callback = StoreCallback(store, tuned, Provenance("j", "here"), counters)

    def on_results(cands, built, results):
        sent.append([candidate_hash(record_of(c, tuned.workload, target)) for c in cands])
        callback(cands, built, results)

    Loop(ctx, builder, OnPhones(local_runner()), Scores(), on_results).run(
        max_trials=32, per_batch=8, database=database)
    return inner, scored, sent, counters


def test_a_round_a_borrowed_model_ranks_picks_its_first_batch_from_a_ranked_sample():
    """A new workload the key's model ranks (SearchPlan.sample, workers/metaschedule/firstbatch.py):
    its first batch is the best the model predicts of `sample` random schedules, one picked
    at random from the rest; the evolutionary search makes the batches after it."""
    from workers.metaschedule.search import SearchPlan

    inner, scored, sent, counters = ranked_round(SearchPlan(want=16, sample=32))
    sample, scores = scored[0]
    assert len(sample) == 32  # the first predict: the random sample, ranked once
    best = {h for _, h in sorted(zip(scores, sample, strict=True), reverse=True)[:7]}
    first = sent[0]
    assert len(first) == 8 and best <= set(first), (first, best)  # 7 best predicted...
    assert len(set(first) - best) == 1  # ...and one of the rest, at random
    assert inner.max_trials == 32 - 8 and inner.batches >= 1  # then the evolutionary search
    assert counters.new == 16 and len(sent) == 2


def test_a_borrowed_model_picks_each_batch_from_a_pool_the_search_evolved_blind():
    """While a borrowed model ranks (SearchPlan.pool), the evolutionary search does not score
    its population with it (a feature extraction a schedule, three populations a batch): it
    evolves under random scores and proposes `pool` x the batch; the model ranks that pool
    once, and the batch is its 7 best of 8 and one of the rest at random."""
    from workers.metaschedule.search import SearchPlan

    inner, scored, sent, counters = ranked_round(SearchPlan(want=16, pool=4))
    assert inner.max_trials == 4 * 32 and inner.args[0] == 4 * 8  # the search proposes pools
    assert counters.new == 16 and len(sent) == 2
    assert len(scored) == 2  # the model scored each pool once, not the search's population
    for (pool, scores), batch in zip(scored, sent, strict=True):
        assert 8 < len(pool) <= 32 and set(batch) <= set(pool)
        best = {h for _, h in sorted(zip(scores, pool, strict=True), reverse=True)[:7]}
        assert len(batch) == 8 and best <= set(batch), (batch, best)
        assert len(set(batch) - best) == 1


def test_a_pooled_round_without_a_count_measures_whole_batches():
    """SearchPlan.want 0 (as many as the search proposes): each pool still gives a whole
    batch (8 of 32), until the loop's 32 trials are sent."""
    from workers.metaschedule.search import SearchPlan

    _, scored, sent, counters = ranked_round(SearchPlan(pool=4))
    assert [len(b) for b in sent] == [8, 8, 8, 8] and counters.new == 32, sent
    assert all(len(pool) > 8 for pool, _ in scored)
