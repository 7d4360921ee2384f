"""A tuning record's trace is data: only what MetaSchedule's own search writes is accepted.

A trace is replayed on the workload to get the schedule a kernel is built from, and a few
of its instructions reach the code generator: an `Annotate` with `pragma_import_llvm` (or
`pragma_import_c`) links the text it carries as LLVM IR (C) into the kernel, foreign native
code that then runs on the worker host's builder and on every phone. A log imported from
elsewhere, or a store others can write, must not be able to do that. `trace_problem` checks
a record's trace against an allow-list: the instruction kinds MetaSchedule's schedule rules,
mutators and postprocessors produce, and the annotation keys they set. It is checked at
`farm cache import` (the record is refused with the reason) and again where a worker or a
compile turns a stored record into a schedule (the record is skipped, and logged).
"""

from __future__ import annotations

import re

from farm.core.aliases import JsonList

KINDS = frozenset({
    # lookups
    "GetSBlock", "GetBlock", "GetLoops", "GetChildBlocks", "GetProducers", "GetConsumers",
    "GetOutputBlocks",
    # loops
    "Split", "LoopPartition", "Fuse", "Merge", "Reorder", "ReorderBlockIterVar", "AddUnitLoop",
    "Parallel", "Vectorize", "Unroll", "Bind",
    # blocks and buffers
    "CacheRead", "CacheWrite", "CacheInplace", "CacheIndex", "ReIndex", "ComputeAt",
    "ReverseComputeAt", "ComputeInline", "ReverseComputeInline", "DecomposeReduction",
    "DecomposePadding", "RFactor", "Blockize", "Tensorize", "StorageAlign", "SetScope",
    "SetAxisSeparator", "TransformLayout", "TransformBlockLayout", "PadEinsum",
    "RollingBuffer",
    # annotations (keys checked below) and sampling
    "Annotate", "Unannotate", "SamplePerfectTile", "SamplePartitionedTile",
    "SampleCategorical", "SampleComputeLocation", "EnterPostproc",
})

ANNOTATIONS = frozenset({
    "pragma_auto_unroll_max_step", "pragma_unroll_explicit", "pragma_vectorize",
    "software_pipeline_stage", "software_pipeline_order", "software_pipeline_async_stages",
    "warp_execution",
})
ANNOTATION_PREFIX = "meta_schedule."  # MetaSchedule's own keys (tiling_structure, parallel..)


def trace_problem(record: JsonList) -> str | None:
    """Why the trace of a stored record (`[trace, run_secs, target, args_info]`, the trace
    `[instructions, decisions]`) must not be built, or None when every instruction is one
    MetaSchedule's search writes."""
    try:
        insts = record[0][0]
    except (TypeError, IndexError, KeyError):
        return "not a tuning record (no trace)"
    if not isinstance(insts, list):
        return "its trace is not a list of instructions"
    for i, inst in enumerate(insts):
        if not (isinstance(inst, list) and len(inst) == 4 and isinstance(inst[0], str)):
            return f"instruction {i} is malformed"
        kind, _inputs, attrs, _outputs = inst
        if kind not in KINDS:
            return f"instruction {i} is {kind!r}, which MetaSchedule's search never writes"
        if kind in ("Annotate", "Unannotate"):
            key = attrs[0] if isinstance(attrs, list) and attrs else None
            if not isinstance(key, str) or not (key in ANNOTATIONS
                                                or key.startswith(ANNOTATION_PREFIX)):
                return (f"instruction {i} annotates {key!r}, a key MetaSchedule's search never "
                        "sets (pragma_import_* links foreign native code into the kernel)")
    return None


def check_trace(record: JsonList) -> None:
    """Raise ValueError when the record's trace must not be built (`trace_problem`): where a
    stored record becomes a schedule to build (the store can be written by others)."""
    problem = trace_problem(record)
    if problem is not None:
        raise ValueError(f"refused, never built: {problem}")


_FOREIGN = re.compile(r'"(?:tirx?)\.((?:tvm_)?call_(?:pure_)?extern|call_llvm(?:_pure)?_intrin|'
                      r'(?:tvm_)?call_c?packed(?:_lowered)?|tvm_call_trace_packed)"')


def foreign_calls(mod_json: str) -> list[str]:
    """The calls out of TVM's own operators in a workload's TIR (its TVM JSON): an extern C
    function (`call_extern("system", ...)`), an LLVM intrinsic or a packed function named by
    the module. MetaSchedule's tasks of a model have none; an imported one that does is
    refused (its kernel would call whatever it names, on the builder and on every phone)."""
    return sorted(set(_FOREIGN.findall(mod_json)))
