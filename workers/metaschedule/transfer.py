"""A new workload's first candidates: the best schedules of its relatives, replayed on it.

A workload the store has never measured starts blind: its first batch is random (or ranked
by the key's cost model where its held-out check allows: workers/metaschedule/heldout.py). But the
store holds the best schedule of every workload of the same model key (device key + target),
and a MetaSchedule schedule is a trace of primitives on named blocks and loops, not of one
shape. A workload's relatives are the key's workloads of its operator family (the anchor
block's structure, farm/tir/family.py: a dense layer of other widths with or without bias
and activation, a convolution of other channels and kernel size; never another family, and
never by the task's name), the closest in FLOPs first. The new workload's own design spaces
(MetaSchedule's schedule rules on its blocks) are sampled with the decisions of a relative's
best trace where they fit: a relative that tiles as many loops as deep gives its tile sizes,
fitted to the new loop extents (each `SamplePerfectTile` keeps the inner factors that divide
the new extent, nearest below, the outermost takes the rest), and
its unrolling and other choices where both traces make as many. A relative whose decisions
do not fit is skipped; what fits is checked by the target's postprocessors, as every sampled
schedule is, and measured and checked against the reference kernel like any candidate. This is transfer
tuning (Gibson & Cano, 2022): schedules reused across operators, no model in between.

The round measures them first, as its own batch (up to `transfer_seeds`; 0: never); they
are new candidates of the workload and count against its trials (a round of 4 trials with
relatives is transfer alone: no search). The evolutionary search then starts from the
store's best of the workload, which now includes them. (It failed seeded rounds before,
"old_outputs.size() == new_outputs.size()": a seed's postprocessing was not marked with
`enter_postproc`, so the search's mutations replayed the postprocessors' splits as schedule
instructions; see `replay` and workers/metaschedule/database.py `replays`.) A store of unrelated
models gives a new workload no relative, and its round is a fresh farm's.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from farm.core.aliases import IRModule, MeasureCandidate, Schedule, Trace, TuneContext, TVMObject
from farm.core.messages import TuneTask
from farm.store.learned import model_key
from farm.store.store import ModelStore
from farm.tir.family import family
from farm.tir.module import load_mod, tuning_record

log = logging.getLogger(__name__)

RELATIVES_TRIED = 48  # relatives whose best schedule is replayed, the closest in size first


def task_family(task: TuneTask) -> str:
    """The task's operator family (farm/tir/family.py): as extraction wrote it, or from its
    TIR for a task stored before families were kept."""

    return task.family or family(load_mod(task))


BACKFILL = 64  # workloads of a key stored without a family that one round classifies


def families_of(store: ModelStore, mkey: str) -> dict[str, str]:
    """Workload key -> family for a model key's workloads; those stored before families were
    kept are classified from their TIR (up to BACKFILL a call) and indexed for good."""
    from dataclasses import replace

    families = store.model_families(mkey)
    missing = [wk for wk in store.model_workloads(mkey) if wk not in families][:BACKFILL]
    for wk in missing:
        task = store.get_workload(wk)
        if task is None:
            continue
        try:
            families[wk] = task_family(task)
        except Exception as e:  # noqa: BLE001 - an unreadable workload has no relatives
            log.warning("workload %s: its operator family is not known: %s", wk, e)
            continue
        store.put_workload(replace(task, family=families[wk]))  # indexes its family
    return families


def relatives_in_store(store: ModelStore, task: TuneTask, family: str) -> bool:
    """Whether the task's model key holds another workload of `family`."""
    families = families_of(store, model_key(task.device_key, task.target))
    return any(fam == family for wk, fam in families.items() if wk != task.workload_key)


def relatives(store: ModelStore, task: TuneTask) -> list[TuneTask]:
    """The other workloads of the task's model key of its operator family (by their anchor
    block's structure, farm/tir/family.py: a dense layer's relatives are dense layers and
    matmuls of other shapes and epilogues, never a convolution) that have a best record,
    the closest in work (FLOPs) first. A workload stored before families were kept joins
    when a job submits it again."""
    mine = task_family(task)
    families = families_of(store, model_key(task.device_key, task.target))
    found = []
    for wk, fam in families.items():
        if wk == task.workload_key or fam != mine:
            continue
        other = store.get_workload(wk)
        if other is not None:
            found.append(other)

    def distance(other: TuneTask) -> float:
        if task.flop > 0 and other.flop > 0:
            return abs(math.log(other.flop / task.flop))
        return math.inf

    found.sort(key=lambda t: (distance(t), t.workload_key))
    return found[:RELATIVES_TRIED]


def _divisor_at_most(n: int, f: int) -> int:
    for g in range(max(1, min(f, n)), 0, -1):
        if n % g == 0:
            return g
    return 1


def fit_tiles(factors: list[int], extent: int) -> list[int]:
    """Tile factors of one loop fitted to another extent: innermost first, each the largest
    divisor of what is left that is at most the old factor; the outermost takes the rest."""
    if factors and math.prod(factors) == extent:
        return factors
    out, rest = [1] * len(factors), extent
    for i in range(len(factors) - 1, 0, -1):
        out[i] = _divisor_at_most(rest, factors[i])
        rest //= out[i]
    if factors:
        out[0] = rest
    return out


Decisions = dict[str, list[TVMObject]]  # instruction kind -> its sampling decisions, in order


def sampled(trace: Trace) -> Decisions:
    """A trace's sampling decisions, per instruction kind, in order."""
    out: Decisions = {}
    for inst in trace.insts:
        if inst.kind.name.startswith("Sample") and inst in trace.decisions:
            out.setdefault(inst.kind.name, []).append(trace.decisions[inst])
    return out


def replay(decisions: Decisions, space: Schedule, mod: IRModule,
           postprocs: list[TVMObject]) -> MeasureCandidate | None:
    """A measure candidate of `mod`: one of its design spaces sampled with a relative's
    decisions (its tiles fitted to the extents here), or None where they do not fit (another
    number of tiled loops, a tiling of other depth, a compute location that is not here).
    Decisions of a kind the two traces sample a different number of times (an epilogue's
    compute location) stay the space's own."""
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate

    mine = {k: len(v) for k, v in sampled(space.trace).items()}
    tiles = "SamplePerfectTile"
    if mine.get(tiles, 0) != len(decisions.get(tiles, [])) or not mine.get(tiles):
        return None
    # tiles and unrolling only: a relative's compute locations left traces TVM's evolutionary
    # search could not replay or mutate ("old_outputs.size() == new_outputs.size()")
    use = {k: list(v) for k, v in decisions.items()
           if k in (tiles, "SampleCategorical") and mine.get(k) == len(v)}
    sch = Schedule(mod)

    def provide(inst: TVMObject, inputs: list[TVMObject], _attrs: object,
                decision: TVMObject) -> TVMObject:
        queue = use.get(inst.kind.name)
        if not queue:
            return decision
        theirs = queue.pop(0)
        if inst.kind.name == tiles:
            return fit_tiles([int(f) for f in theirs], int(sch.get(inputs[0]).extent))
        return theirs

    try:
        space.trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=provide)
        # as MetaSchedule's own sampling does: the postprocessors' instructions are marked as
        # such, so a replay of the trace (the evolutionary search's, from the store's top
        # records) drops them and applies the postprocessors again. Without the mark they
        # were replayed as schedule instructions on loops they had made, and the search
        # failed ("old_outputs.size() == new_outputs.size()")
        sch.enter_postproc()
        if not all(p.apply(sch) for p in postprocs):
            return None
    except Exception:  # noqa: BLE001 - the decisions do not fit this space
        return None
    return MeasureCandidate(sch, ArgInfo.from_entry_func(sch.mod, remove_preproc=True))


def seeds(store: ModelStore, task: TuneTask, limit: int
          ) -> Callable[[TuneContext], list[tuple[MeasureCandidate, str]]] | None:
    """Up to `limit` candidates from the relatives' best schedules, each with its source
    ("transfer:<relative's name>"), as a function of the round's TuneContext (the search
    calls it once it has one: the postprocessors come from it); None for `limit` 0."""
    from tvm.s_tir.meta_schedule.database import Workload

    if limit <= 0:
        return None

    def make(context: TuneContext) -> list[tuple[MeasureCandidate, str]]:
        spaces = list(context.space_generator.generate_design_space(context.mod))
        postprocs = list(context.space_generator.postprocs)
        per_relative: list[list[tuple[MeasureCandidate, str]]] = []
        tried = 0
        for other in relatives(store, task):
            tried += 1
            best = store.best(other.workload_key)
            if best is None:
                continue
            try:
                trace = tuning_record(best.record, Workload(load_mod(other))).trace
            except Exception:  # noqa: BLE001 - an unreadable record only costs this relative
                continue
            decisions = sampled(trace)
            cands = [c for c in (replay(decisions, sp, context.mod, postprocs) for sp in spaces)
                     if c is not None]
            if cands:
                per_relative.append([(c, f"transfer:{other.name}") for c in cands])
                log.info("workload %s: seeded from the best schedule of %s (%d design spaces)",
                         task.workload_key, other.name, len(cands))
            if len(per_relative) >= limit:
                break
        # each relative's first fitting space first, then their other spaces
        ranked = [c for depth in range(len(spaces)) for cands in per_relative
                  for c in cands[depth:depth + 1]]
        log.info("workload %s: transfer: %d of %d relatives' best schedules applied, %d "
                 "candidates", task.workload_key, len(per_relative), tried, len(ranked[:limit]))
        return ranked[:limit]

    return make
