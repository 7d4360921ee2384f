"""A tuning task's TIR module, back from the TVM JSON it crosses processes as; a stored
record as MetaSchedule's TuningRecord of it."""

from __future__ import annotations

from farm.core.aliases import IRModule, JsonList, TVMObject
from farm.core.messages import TuneTask
from farm.core.traces import check_trace


def load_mod(task: TuneTask) -> IRModule:
    """The task's TIR IRModule back from its TVM JSON."""
    import tvm

    return tvm.ir.load_json(task.mod_json)


def tuning_record(record: JsonList, workload: TVMObject) -> TVMObject:
    """A stored record's JSON as MetaSchedule's TuningRecord of `workload`, to be replayed,
    built or exported. ValueError when its trace holds what MetaSchedule's search never
    writes (farm/core/traces.py): the store can be written by others, so every record is
    checked here, before TVM reads it."""
    from tvm.s_tir.meta_schedule.database import TuningRecord

    check_trace(record)
    return TuningRecord.from_json(record, workload)
