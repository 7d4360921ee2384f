"""A tuning task's TIR module, back from the TVM JSON it crosses processes as; a stored
record as MetaSchedule's TuningRecord of it, checked twice before anything builds it; and a
TuningRecord back as plain JSON."""

from __future__ import annotations

import hashlib
import json

from farm.core.aliases import IRModule, JsonList, JsonValue, TVMObject
from farm.core.messages import TuneTask
from farm.core.traces import UnsafeTrace, check_trace, foreign_callees


def load_mod(task: TuneTask) -> IRModule:
    """The task's TIR IRModule back from its TVM JSON."""
    import tvm

    return tvm.ir.load_json(task.mod_json)


def tuning_record(record: JsonList, workload: TVMObject) -> TVMObject:
    """A stored record's JSON as MetaSchedule's TuningRecord of `workload`, to be replayed,
    built or exported. UnsafeTrace (a ValueError) when its trace holds what MetaSchedule's
    search never writes (farm/core/traces.py, read before TVM parses any of it), or when the
    module the trace produces calls out of TVM's operators where the workload and the
    tensor intrinsics the trace names do not: the store can be written by others, so every
    record is checked here, before TVM builds it."""
    from tvm.s_tir.meta_schedule.database import TuningRecord

    check_trace(record)
    rec = TuningRecord.from_json(record, workload)
    check_schedule(rec.trace, workload.mod)
    return rec


def check_schedule(trace: TVMObject, mod: IRModule) -> None:
    """UnsafeTrace when the module `trace` makes of `mod` calls out of TVM's operators (an
    extern C function, an LLVM intrinsic, a packed function) that neither `mod` nor the
    tensor intrinsics its Tensorize instructions name already call. Each (trace, module)
    is replayed once per process."""
    import tvm_ffi

    key = (hashlib.sha256(str(trace).encode()).hexdigest(), int(tvm_ffi.structural_hash(mod)))
    found = _VERDICTS.get(key)
    if found is None:
        found = _replayed_calls(trace, mod)
        if len(_VERDICTS) >= VERDICTS_KEPT:
            _VERDICTS.clear()
        _VERDICTS[key] = found
    if found:
        raise UnsafeTrace(f"refused, never built: the schedule its trace makes calls "
                          f"{', '.join(found)}, which the workload does not")


VERDICTS_KEPT = 8192
# (the trace's text, the module's structural hash) -> the calls its schedule adds: plain
# values as keys (TVM objects hash by identity, and each read of a record makes new ones)
_VERDICTS: dict[tuple[str, int], tuple[str, ...]] = {}


def _replayed_calls(trace: TVMObject, mod: IRModule) -> tuple[str, ...]:
    import tvm
    from tvm.s_tir import Schedule, TensorIntrin

    sch = Schedule(mod)
    trace.apply_to_schedule(sch, remove_postproc=False)
    allowed = set(foreign_callees(tvm.ir.save_json(mod)))
    for inst in trace.insts:
        if inst.kind.name == "Tensorize":
            intrin = TensorIntrin.get(str(inst.attrs[0]))
            allowed |= set(foreign_callees(tvm.ir.save_json(intrin.impl)))
    return tuple(sorted(set(foreign_callees(tvm.ir.save_json(sch.mod))) - allowed))


def record_json(rec: TVMObject) -> JsonList:
    """A TuningRecord as plain JSON, as MetaSchedule's JSONDatabase writes it: an index map
    (a layout transform's) as its TVM JSON text. (TuningRecord.as_json raises on those.)"""
    out = [_plain(rec.trace.as_json(remove_postproc=False)),
           [float(x) for x in rec.run_secs] if rec.run_secs is not None else None,
           _plain(rec.target.export()) if rec.target is not None else None,
           [_plain(a.as_json()) for a in rec.args_info] if rec.args_info is not None else None]
    return json.loads(json.dumps(out))  # plain: every TVM string and number a Python one


def _plain(obj: object) -> JsonValue:
    import tvm
    from tvm.tirx import FloatImm, IndexMap, IntImm
    from tvm_ffi import Array, Map

    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, IntImm | FloatImm):
        return obj.value  # type: ignore[no-any-return]
    if isinstance(obj, Array | list | tuple):
        return [_plain(x) for x in obj]
    if isinstance(obj, Map | dict):
        return {str(_plain(k)): _plain(v) for k, v in obj.items()}
    if isinstance(obj, IndexMap):
        return str(tvm.ir.save_json(obj))
    raise TypeError(f"a tuning record holds a {type(obj).__name__}, which it cannot be "
                    "written as")
