"""A round's search, the same wherever it runs: on the phone host (workers/round/measure.py)
or on a helper host that searches for it (workers/round/lend/helper_side.py). Only where a batch is
measured (`Measure`), what the store is told of it, and the hand-off check differ."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from farm.core.aliases import IRModule, Target
from farm.core.messages import RoundRequest, TuneTask
from farm.devices import intrinsics
from farm.store.store import ModelStore, RecordReader
from farm.tir.module import load_mod
from workers.metaschedule.costmodel import RankedModel, round_model
from workers.metaschedule.database import StoreDatabase
from workers.metaschedule.search import RoundFacts, TunedWorkload, round_search
from workers.round.context import WorkerContext
from workers.round.loop import BATCH, Searcher

if TYPE_CHECKING:
    from workers.round.loop import Measure, OnResults

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Workload:
    """A round's workload as it is tuned: its TIR and target, the store's view of it (the
    database MetaSchedule reads) and its identity for records."""

    mod: IRModule
    target: Target
    database: StoreDatabase
    tuned: TunedWorkload

    @classmethod
    def load(cls, store: RecordReader, task: TuneTask) -> Workload:
        import tvm

        mod = load_mod(task)
        intrinsics.load_for(str(task.target.get("kind", "llvm")))  # CUDA, Hexagon: theirs too
        target = tvm.target.Target(task.target)
        database = StoreDatabase(store, task.workload_key, mod)
        return cls(mod, target, database, TunedWorkload(task.workload_key, database.workload,
                                                        target))


@dataclass(frozen=True)
class Where:
    """Where a round's batches go: measured by `measure`, their results told to `on_results`
    (the store's callback; a helper commits nothing), `stop` asked before each batch after the
    first (the hand-off at a job's tail), the search a batch ahead or not."""

    measure: Measure
    on_results: OnResults
    stop: Callable[[], bool] | None
    ahead: bool
    origins: dict[str, str] | None = None  # where seeds came from, for their records' source


def search_round(ctx: WorkerContext, store: ModelStore, req: RoundRequest, task: TuneTask,
                 w: Workload, trials: int, where: Where, single: bool = False,
                 phones: int = 0) -> tuple[RoundFacts, dict[str, int], dict[str, float]]:
    """Search, build and have measured `trials` new candidates of the round's workload: what
    the round knew when it began, its search's counts (skipped, fresh, seeded, ...) and the
    CPU seconds of each part of it here (`setup`: the cost model and search set up, then
    pipeline.PARTS)."""
    t0, c0 = time.monotonic(), time.process_time()
    profile = ctx.profile(req.device_key)
    threads = ctx.search_threads(profile)
    cost_model, learned, ranked_by = (None, 0, "") if single else round_model(
        store, task, w.database.workload, w.target, threads)  # ranked_by "": the first batch
    facts = RoundFacts(trials, single, learned, ranked_by,
                       borrowed=isinstance(cost_model, RankedModel))  # the key's model ranks
    search = round_search(store, task, w.tuned, facts, ctx.config, stop=where.stop,
                          origins=where.origins)
    _log_start(ctx, req, task, facts, (search.cold, len(search.verify)), (phones, threads))
    setup_s, setup_cpu = time.monotonic() - t0, time.process_time() - c0
    loop = Searcher(w.mod, w.target, search, threads, task.name, req.round_id).loop(
        ctx.builder(profile), where.measure, cost_model, where.on_results, ahead=where.ahead)
    # the search stops at `trials` new; stored proposals use up some of its trials
    loop.run(max_trials=2 * trials, per_batch=min(BATCH, trials), database=w.database)
    log.info("round %s of %s on %s: %d batches in %.1f s: cost model and search set up %.1f "
             "s, %s; CPU: set up %.1f s, %s (of search: seeds %.1f s, pools ranked %.1f s)",
             req.round_index + 1, task.name, ctx.host, loop.batches, time.monotonic() - t0,
             setup_s, ", ".join(f"{part} {s:.1f} s" for part, s in loop.spent.items()),
             setup_cpu, ", ".join(f"{part} {s:.1f} s" for part, s in loop.cpu.items()),
             search.spent["seeds"], search.spent["ranking"])
    return facts, dict(search.counts), {"setup": setup_cpu, **loop.cpu}


def _log_start(ctx: WorkerContext, req: RoundRequest, task: TuneTask, facts: RoundFacts,
               search: tuple[bool, int], sizes: tuple[int, int]) -> None:
    (cold, verify), (phones, threads) = search, sizes
    log.info("round %s of %s on %s: %d trials (cost model trained on %d%s, %s%d search "
             "threads%s)", req.round_index + 1, task.name, ctx.host, facts.trials, facts.learned,
             ", cold: first batch at random" if cold
             else f", ranked by {facts.ranked_by}" if facts.ranked_by else "",
             f"{phones} phones, " if phones else "searching for a phone host, ", threads,
             f", {verify} imported records to verify" if verify else "")
