"""TVM's default schedule of a workload: what a round measures with its first batch, so a
task's default time is known and its tuned schedule is never slower than it as measured."""

from __future__ import annotations

from tvm.s_tir.meta_schedule.database import Workload

from farm.core.aliases import MeasureCandidate, Target
from farm.devices.cross import gpu_default_schedule_of


def baseline_candidate(workload: Workload, target: Target | None = None) -> MeasureCandidate:
    """TVM's default schedule of the workload. On a CPU its function as it is, unscheduled: a
    trace that only gets the root block (TVM's JSONDatabase ignores a record whose trace is
    empty). On a GPU (an unscheduled function has no kernel) what TVM's GPU pipeline gives an
    untuned model: the first of its dlight rules that fits (farm/devices/cross.py), with the
    trace of what it did."""
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate

    args = ArgInfo.from_prim_func(workload.mod["main"])
    if target is not None and target.kind.name != "llvm":
        found = gpu_default_schedule_of(workload.mod, target)
        if found is None:
            raise ValueError("no default GPU schedule fits it")
        return MeasureCandidate(found, args)
    sch = Schedule(workload.mod)
    sch.get_sblock("root")
    return MeasureCandidate(sch, args)
