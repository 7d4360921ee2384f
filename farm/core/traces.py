"""A tuning record's trace is data: only what MetaSchedule's own search writes is accepted.

A trace is replayed on the workload to get the schedule a kernel is built from, and a few
of its instructions reach the code generator: an `Annotate` with `pragma_import_llvm` (or
`pragma_import_c`) links the text it carries as LLVM IR (C) into the kernel, foreign native
code that then runs on the worker host's builder and on every phone. A log imported from
elsewhere, or a store others can write, must not be able to do that. `trace_problem` checks
a record's trace against an allow-list: the instruction kinds MetaSchedule's schedule rules,
mutators and postprocessors produce, and the annotation keys they set. Some values of a
trace are IR themselves: a layout transform's index map (and its pad value) is a TVM object
graph carried as a JSON string, which TVM parses and which reaches the kernel as it is (an
index map holding `call_extern("system", ...)` builds into a kernel that runs a command).
Every such value is decoded here, without TVM, and must hold variables, constants and
arithmetic only (`ir_graph_problem`). It is checked at `farm cache import` (the record is
refused with the reason) and again where a worker or a compile turns a stored record into a
schedule (the record is skipped, and logged); there the module the replayed trace produces
is checked for foreign calls too (farm/tir/module.py), a second line behind this one.
"""

from __future__ import annotations

import json
import re

from farm.core.aliases import JsonList, JsonValue

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


# What an index map (or a pad value) may hold: TVM JSON graph node types of variables,
# constants and arithmetic; a call, a buffer access, a let, anything else is refused.
IR_NODES = frozenset({
    "None", "int", "float", "bool", "ffi.String", "ffi.Array", "ir.PrimType", "ir.Var",
    "tirx.SizeVar", "ir.IntImm", "ir.FloatImm", "tirx.IndexMap",
    *(f"prim.{op}" for op in ("Add", "Sub", "Mul", "Div", "Mod", "FloorDiv", "FloorMod", "Min",
                              "Max", "EQ", "NE", "LT", "LE", "GT", "GE", "And", "Or", "Not",
                              "Select", "Cast")),
})
IR_GRAPH_KEYS = frozenset({"root_index", "nodes", "metadata"})
# Attributes TVM parses as an IR graph whatever their first character (instruction kind ->
# index of the attribute): TransformLayout's pad value, TransformBlockLayout's index map.
IR_ATTRS = {"TransformLayout": 2, "TransformBlockLayout": 0}


def ir_graph_problem(text: str) -> str | None:
    """Why a TVM JSON object graph (`tvm.ir.save_json`'s text, as a trace carries an index
    map) must not be parsed by TVM, or None when it holds only variables, constants and
    arithmetic (IR_NODES) and is an index map."""
    try:
        graph = json.loads(text)
    except (ValueError, RecursionError):
        return "an IR value that is not JSON"
    if not isinstance(graph, dict) or set(graph) - IR_GRAPH_KEYS or "nodes" not in graph:
        return "an IR value that is not a TVM object graph of an index map"
    nodes = graph["nodes"]
    if not isinstance(nodes, list) or not nodes:
        return "an IR value with no nodes"
    kinds = {node.get("type") if isinstance(node, dict) else None for node in nodes}
    if kinds - IR_NODES:
        shown = ", ".join(sorted(repr(k) for k in kinds - IR_NODES))
        return (f"an index map holds {shown}: only variables, constants and arithmetic "
                "are allowed (a call in an index map is built into the kernel)")
    root = graph.get("root_index", 0)
    if not (isinstance(root, int) and 0 <= root < len(nodes)
            and nodes[root].get("type") == "tirx.IndexMap"):
        return "an IR value that is not an index map"
    return None


def _ir_values(value: JsonValue) -> list[str]:
    """The strings of an instruction's inputs that TVM parses as IR: `{...}` (its trace
    reader takes such an input for a TVM object graph), at any depth."""
    if isinstance(value, str):
        return [value] if value[:1] == "{" and value[-1:] == "}" else []
    if isinstance(value, list):
        return [s for v in value for s in _ir_values(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _ir_values(v)]
    return []


def _inst_problem(kind: str, inputs: JsonValue, attrs: JsonValue) -> str | None:
    """Why one instruction (known kind) must not be replayed, or None."""
    if kind in ("Annotate", "Unannotate"):
        key = attrs[0] if isinstance(attrs, list) and attrs else None
        if not isinstance(key, str) or not (key in ANNOTATIONS
                                            or key.startswith(ANNOTATION_PREFIX)):
            return (f"annotates {key!r}, a key MetaSchedule's search never sets "
                    "(pragma_import_* links foreign native code into the kernel)")
    parsed = _ir_values(inputs) + _ir_values(attrs)
    if kind in IR_ATTRS:
        at = IR_ATTRS[kind]
        value = attrs[at] if isinstance(attrs, list) and len(attrs) > at else None
        if value is not None and not isinstance(value, str):
            return f"its IR attribute {at} is not a TVM object graph"
        if isinstance(value, str) and value not in parsed:
            parsed.append(value)
    for text in parsed:
        problem = ir_graph_problem(text)
        if problem is not None:
            return problem
    return None


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
        kind, inputs, attrs, _outputs = inst
        if kind not in KINDS:
            return f"instruction {i} is {kind!r}, which MetaSchedule's search never writes"
        problem = _inst_problem(kind, inputs, attrs)
        if problem is not None:
            return f"instruction {i} ({kind}): {problem}"
    return None


class UnsafeTrace(ValueError):
    """A record whose trace must not be replayed or built: it holds what MetaSchedule's
    search never writes, or the schedule it makes calls out of TVM's operators."""


def check_trace(record: JsonList) -> None:
    """Raise UnsafeTrace when the record's trace must not be built (`trace_problem`): where a
    stored record becomes a schedule to build (the store can be written by others)."""
    problem = trace_problem(record)
    if problem is not None:
        raise UnsafeTrace(f"refused, never built: {problem}")


# TVM's operators that call out of TVM (their name, after `tir.` or `tirx.`)
_FOREIGN_OPS = (r"tirx?\.((?:tvm_)?call_(?:pure_)?extern|call_llvm(?:_pure)?_intrin|"
                r"(?:tvm_)?call_c?packed(?:_lowered)?|tvm_call_trace_packed)")
_FOREIGN = re.compile(f'"{_FOREIGN_OPS}"')  # as a quoted name in a module's TVM JSON
_FOREIGN_OP = re.compile(_FOREIGN_OPS)  # an ir.Op node's name


def foreign_calls(mod_json: str) -> list[str]:
    """The calls out of TVM's own operators in a workload's TIR (its TVM JSON): an extern C
    function (`call_extern("system", ...)`), an LLVM intrinsic or a packed function named by
    the module. MetaSchedule's tasks of a model have none; an imported one that does is
    refused (its kernel would call whatever it names, on the builder and on every phone)."""
    return sorted(set(_FOREIGN.findall(mod_json)))



def foreign_callees(mod_json: str) -> list[str]:
    """`foreign_calls` with what each calls: `call_extern(system)`, `call_llvm_pure_intrin(
    <intrinsic id>)`, read from the module's TVM JSON graph. A call whose callee is not a
    constant is `op(?)`, and an op `foreign_calls` finds but no call here reads is too."""
    nodes = json.loads(mod_json)["nodes"]

    def constant(index: object) -> str:
        node = nodes[index] if isinstance(index, int) and 0 <= index < len(nodes) else {}
        if node.get("type") in ("ir.StringImm", "ir.IntImm"):
            inner = node["data"].get("value")
            if isinstance(inner, int) and 0 <= inner < len(nodes):
                return str(nodes[inner].get("data"))
        return "?"

    found: set[str] = set()
    for node in nodes:
        if not (isinstance(node, dict) and node.get("type") in ("ir.Call", "tirx.Call")):
            continue
        data = node.get("data", {})
        op = nodes[data["op"]] if isinstance(data.get("op"), int) else {}
        match = _FOREIGN_OP.fullmatch(str(op.get("data", "")))
        if match is not None:
            args = nodes[data["args"]].get("data", []) if isinstance(data.get("args"), int) else []
            found.add(f"{match.group(1)}({constant(args[0]) if args else '?'})")
    named = {f.split("(")[0] for f in found}
    found |= {f"{op}(?)" for op in foreign_calls(mod_json) if op not in named}
    return sorted(found)
