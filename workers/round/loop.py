"""A round's tuning loop: search, build and measure one workload, the search a batch ahead.

MetaSchedule's task scheduler (what `tune_tir` runs) takes one task's batches strictly one
after another: search and build batch k, measure it, tell its results, then search batch k+1.
A round tunes one workload, so its phones waited while its host searched and built, and its
host idled while the phones measured: with 8 phones a batch is measured faster than the host
searches the next one. Here batch k+1 is searched and built while batch k is on the phones
(`ahead`); batch k's results are then told in order, oldest first: to the search
(notify_runner_results), to the store (the round's StoreCallback), to the cost model (as
MetaSchedule's UpdateCostModel does) and its build artifacts removed.

What that costs: the search of batch k+1 has not seen batch k's results (its cost model is a
batch older; MetaSchedule's evolutionary search keeps its own picks apart, so it proposes
nothing twice, and workers/metaschedule/inflight.py measures a candidate two batches both hold once).
`ahead=False` is the old order, tune_tir's.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult
from tvm.s_tir.meta_schedule.runner import RunnerInput, RunnerResult

from farm.core.aliases import IRModule, MeasureCandidate, Target, TuneContext, TVMDatabase
from workers.metaschedule.costmodel import learn
from workers.metaschedule.features import CachedFeatures

if TYPE_CHECKING:
    from tvm.s_tir.meta_schedule.builder import Builder
    from tvm.s_tir.meta_schedule.cost_model import CostModel
    from tvm.s_tir.meta_schedule.runner import Runner
    from tvm.s_tir.meta_schedule.search_strategy import SearchStrategy

log = logging.getLogger(__name__)
BATCH = 16  # candidates per build/measure batch inside a round
# MetaSchedule's own log of a round (a line per trial at INFO): warnings only
TVM_LOG = logging.getLogger("tunefarm.metaschedule")
TVM_LOG.setLevel(logging.WARNING)
# told each measured batch: its candidates, build results and run results (the store's callback)
PARTS = ("space", "search", "build", "phones", "tell", "model")  # what a round's time goes to
OnResults = Callable[[list[MeasureCandidate], list[BuilderResult], list[RunnerResult]], None]


@dataclass
class Flight:
    """A batch on the phones: its candidates, their builds and the runner's futures (a build
    that failed has a future of its error, as MetaSchedule's SendToRunner makes)."""

    cands: list[MeasureCandidate]
    built: list[BuilderResult]
    futures: list[Callable[[], RunnerResult]]

    def results(self) -> list[RunnerResult]:
        return [f() for f in self.futures]


class Measure(Protocol):
    """Where a batch is measured: `send` starts it and returns, per candidate, a call that
    waits for its result; `client_cpu_s`: the CPU seconds this host's measuring client took
    so far (its session, upload and timing calls, in the helper processes)."""

    def send(self, cands: list[MeasureCandidate], built: list[BuilderResult],
             device: str) -> list[Callable[[], RunnerResult]]: ...

    def client_cpu_s(self) -> float: ...


@dataclass
class OnPhones:
    """A batch measured by a TVM runner (this host's phones): MetaSchedule's SendToRunner, a
    failed build's result its error."""

    runner: Runner

    def send(self, cands: list[MeasureCandidate], built: list[BuilderResult],
             device: str) -> list[Callable[[], RunnerResult]]:
        ok = [(c, b) for c, b in zip(cands, built, strict=True) if b.error_msg is None]
        futures = iter(self.runner.run([RunnerInput(str(b.artifact_path), device, c.args_info)
                                        for c, b in ok]) if ok else [])
        return [next(futures).result if b.error_msg is None
                else functools.partial(RunnerResult, None, str(b.error_msg)) for b in built]

    def client_cpu_s(self) -> float:
        return helper_cpu_s(self.runner)


def helper_cpu_s(part: object) -> float:
    """CPU seconds a builder's or runner's calls took in their helper processes so far (one of
    the farm's: workers/metaschedule/procs.py; 0 for another)."""
    return float(getattr(getattr(part, "pool", None), "cpu_s", 0.0))


def device_type(target: Target) -> str:
    """The runner's device type of a target ("cpu", "opencl", ...)."""
    import tvm

    return str(tvm.runtime.device(target.get_target_device_type(), 0)).split(":")[0]


@dataclass
class Loop:
    """One round's loop over its workload's batches (`ctx`: the round's TuneContext, its
    search strategy the round's; `on_results`: the store's side of a measured batch)."""

    ctx: TuneContext
    builder: Builder
    measure: Measure
    cost_model: CostModel | None
    on_results: OnResults
    ahead: bool = True
    batches: int = 0  # batches measured
    # wall seconds of each part: search, build, waiting for the phones, telling the
    # search and store, cost model update
    spent: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    # CPU seconds of each part: this process's (all its threads) while the part ran, and the
    # helper processes' of its calls: the builds' (linker included) in build, the measuring
    # client's in phones
    cpu: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))

    @contextlib.contextmanager
    def _timed(self, part: str) -> Iterator[None]:
        t0, c0 = time.monotonic(), time.process_time()
        try:
            yield
        finally:
            self.spent[part] += time.monotonic() - t0
            self.cpu[part] += time.process_time() - c0

    def run(self, max_trials: int, per_batch: int, database: TVMDatabase) -> None:
        """Batches until the search proposes no more or `max_trials` candidates were sent."""
        client0 = self.measure.client_cpu_s()
        try:
            self._run(max_trials, per_batch, database)
        finally:
            self.cpu["phones"] += self.measure.client_cpu_s() - client0

    def _run(self, max_trials: int, per_batch: int, database: TVMDatabase) -> None:
        with self._timed("space"):
            spaces = self.ctx.generate_design_space()
        self.ctx.pre_tuning(max_trials=max_trials, num_trials_per_iter=per_batch,
                            design_spaces=spaces, database=database, cost_model=self.cost_model)
        flight: Flight | None = None
        built: list[BuilderResult] | None = None
        sent = 0
        try:
            while True:
                with self._timed("search"):
                    cands = self.ctx.generate_measure_candidates() if sent < max_trials else None
                with self._timed("build"):
                    built = self._build(cands) if cands else None
                if flight is not None:  # the batch on the phones while that was searched
                    self._join(flight)
                    flight = None
                if not cands or built is None:
                    break
                flight, built = self._send(list(cands), built), None
                sent += len(cands)
                if not self.ahead:
                    self._join(flight)
                    flight = None
        except BaseException:  # the artifacts of what was built and not joined
            _remove((flight.built if flight is not None else []) + (built or []))
            raise
        self.ctx.post_tuning()

    def _build(self, cands: list[MeasureCandidate]) -> list[BuilderResult]:
        target = self.ctx.target
        b0 = helper_cpu_s(self.builder)
        try:
            return list(self.builder.build([BuilderInput(c.sch.mod, target) for c in cands]))
        finally:
            self.cpu["build"] += helper_cpu_s(self.builder) - b0

    def _send(self, cands: list[MeasureCandidate], built: list[BuilderResult]) -> Flight:
        return Flight(cands, built, self.measure.send(cands, built, device_type(self.ctx.target)))

    def _join(self, flight: Flight) -> None:
        """The batch's results, told in order: search, store, cost model; artifacts removed."""
        with self._timed("phones"):
            results = flight.results()
        self.batches += 1
        try:
            with self._timed("tell"):
                self.ctx.notify_runner_results(flight.cands, results)
                self.on_results(flight.cands, flight.built, results)
        finally:
            _remove(flight.built)
        if self.cost_model is not None:
            with self._timed("model"):
                self._update_model(flight, results)

    def _update_model(self, flight: Flight, results: list[RunnerResult]) -> None:
        """MetaSchedule's UpdateCostModel: what was built and either failed on the phone or
        ran a positive time."""
        keep = [(c, r) for c, b, r in zip(flight.cands, flight.built, results, strict=True)
                if b.error_msg is None and (r.error_msg is not None
                                            or (r.run_secs and sum(float(s) for s in r.run_secs) > 0))]
        if keep:
            assert self.cost_model is not None
            learn(self.cost_model, self.ctx, [c for c, _ in keep], [r for _, r in keep])


def _remove(built: list[BuilderResult]) -> None:
    """The build directories of a batch (MetaSchedule's RemoveBuildArtifact)."""
    for b in built:
        if b.artifact_path is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(os.path.dirname(str(b.artifact_path)))


@dataclass(frozen=True)
class Searcher:
    """What searches a round's workload: its TIR and target, the search strategy, the threads
    of the search and cost model, and the round (its name and id, which seeds the search)."""

    mod: IRModule
    target: Target
    search: SearchStrategy
    threads: int
    name: str
    round_id: str

    def loop(self, builder: Builder, measure: Measure, cost_model: CostModel | None,
             on_results: OnResults, ahead: bool) -> Loop:
        """The round's loop (no cost model: XGBoost's, untrained, as tune_tir makes it)."""
        from tvm.s_tir import meta_schedule as ms
        from tvm.s_tir.meta_schedule.utils import fork_seed

        seed = fork_seed(zlib.crc32(self.round_id.encode()) & 0x7FFFFFFF, n=1)[0]
        ctx = ms.TuneContext(mod=self.mod, target=self.target, space_generator="post-order-apply",
                             search_strategy=self.search, task_name=self.name, rand_state=seed,
                             num_threads=self.threads, logger=TVM_LOG)

        model = cost_model if cost_model is not None else ms.CostModel.create(
            "xgb", num_tuning_cores=self.threads, tree_method="auto", extractor=CachedFeatures())
        return Loop(ctx, builder, measure, model, on_results, ahead=ahead)
