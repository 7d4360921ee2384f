"""A new workload's first candidates: the best schedules of its relatives, replayed on it.

A workload the store has never measured starts blind: its first batch is random (or ranked
by the key's cost model, which transfers little: bench/ranking.md). But the store holds the
best schedule of every workload of the same model key (device key + target), and a
MetaSchedule schedule is a trace of primitives on named blocks and loops, not of one shape.
The new workload's own design spaces (MetaSchedule's schedule rules on its blocks) are
sampled with the decisions of a relative's best trace where they fit: a relative that tiles
as many loops as deep (the same operator at another shape, with whatever epilogue: a dense
layer of other widths with or without bias and activation, a convolution of other channels)
gives its tile sizes, fitted to the new loop extents (each `SamplePerfectTile` keeps the
inner factors that divide the new extent, nearest below, the outermost takes the rest), and
its unrolling and other choices where both traces make as many. A relative whose decisions
do not fit is skipped; what fits is checked by the target's postprocessors, as every sampled
schedule is, and measured and checked against the reference kernel like any candidate. This is transfer
tuning (Gibson & Cano, 2022): schedules reused across operators, no model in between.

The round measures them first, as its own batch (`transfer_seeds` = N > 0; the default, 0,
is off: TVM's evolutionary search crashed on some seeded rounds); they are new candidates
of the workload and count against its trials. The evolutionary search then starts from
the store's best of the workload, which now includes them.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable

from farm.core.aliases import IRModule, MeasureCandidate, Schedule, Trace, TuneContext, TVMObject
from farm.core.messages import TuneTask
from farm.store import RecordStore
from farm.store.learned import model_key

log = logging.getLogger(__name__)

RELATIVES_TRIED = 48  # relatives whose best schedule is replayed (the same operator first)
WORKLOADS_READ = 512  # workloads of a key read to find them


def family(name: str) -> str:
    """A task's operator family from its name: digits dropped ("fused_matmul3_add1" and
    "fused_matmul_add" are one family)."""
    return re.sub(r"\d+", "", name)


def relatives(store: RecordStore, task: TuneTask) -> list[TuneTask]:
    """Other workloads of the task's model key with a best record, its own family first."""
    mkey = model_key(task.device_key, task.target)
    found = []
    for wk in store.model_workloads(mkey)[:WORKLOADS_READ]:
        if wk == task.workload_key:
            continue
        other = store.get_workload(wk)
        if other is not None:
            found.append(other)
    found.sort(key=lambda t: (family(t.name) != family(task.name), t.name))
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
        if not all(p.apply(sch) for p in postprocs):
            return None
    except Exception:  # noqa: BLE001 - the decisions do not fit this space
        return None
    return MeasureCandidate(sch, ArgInfo.from_entry_func(sch.mod, remove_preproc=True))


def seeds(store: RecordStore, task: TuneTask,
          limit: int) -> Callable[[TuneContext], list[MeasureCandidate]] | None:
    """Up to `limit` candidates from the relatives' best schedules, as a function of the
    round's TuneContext (the search calls it once it has one: the postprocessors come from
    it); None for `limit` 0."""
    from tvm.s_tir.meta_schedule.database import Workload

    from farm.tir.module import load_mod, tuning_record

    if limit <= 0:
        return None

    def make(context: TuneContext) -> list[MeasureCandidate]:
        spaces = list(context.space_generator.generate_design_space(context.mod))
        postprocs = list(context.space_generator.postprocs)
        per_relative: list[list[MeasureCandidate]] = []
        for other in relatives(store, task):
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
                per_relative.append(cands)
                log.info("workload %s: seeded from the best schedule of %s (%d design spaces)",
                         task.workload_key, other.name, len(cands))
            if len(per_relative) >= limit:
                break
        # each relative's first fitting space first, then their other spaces
        ranked = [c for depth in range(len(spaces)) for cands in per_relative
                  for c in cands[depth:depth + 1]]
        return ranked[:limit]

    return make
