"""Block names: the one part of a TIR function that its workload key ignores and a trace needs.

A workload key is the TIR's structural hash, and structural equality ignores block names;
but a tuning record's trace finds its blocks by name (`GetSBlock("x_sum", "main")`). TVM
names some blocks after the Relax variables around them (`x_sum`, `lv35_red`), so the same
operator in two models (a TorchScript and a torch.export file of one model, two layer norms
of one model) has one key and different block names: a record tuned on one cannot be
replayed on the other.

So the farm gives every block a canonical name, its place in the function (`canonical`,
applied to the fused module before its tasks are cut): structurally equal functions then
have equal names everywhere (the store's workloads, the jobs' tasks, the compiled module).
Records stored under other names (a store filled before this rule) are translated to the
names of the function they are applied to (`translate`), block by block in the same order.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from farm.core.aliases import IRModule, JsonDict, JsonList, PrimFunc

_SBLOCK = "s_tir.SBlock"
ROOT = "root"


def _graph(node: IRModule | PrimFunc) -> JsonDict:
    import tvm

    return json.loads(tvm.ir.save_json(node))


def _blocks(graph: JsonDict) -> list[JsonDict]:
    """The SBlock nodes of a saved TVM object graph, in the graph's order (post-order: the
    same order for structurally equal functions)."""
    return [n for n in graph["nodes"] if n.get("type") == _SBLOCK]


def _names(graph: JsonDict, blocks: list[JsonDict]) -> list[str]:
    return [graph["nodes"][b["data"]["name_hint"]]["data"] for b in blocks]


def block_names(func: IRModule | PrimFunc) -> list[str]:
    """The function's block names, in canonical order."""
    graph = _graph(func)
    return _names(graph, _blocks(graph))


def canonical(func: PrimFunc) -> PrimFunc:
    """The function with its blocks named by their place (`block_0`, ...; the root block keeps
    `root`); the function itself when it has no block to rename."""
    import tvm

    graph = _graph(func)
    nodes, blocks = graph["nodes"], _blocks(graph)
    names = _names(graph, blocks)
    wanted = [name if name == ROOT else f"block_{i}" for i, name in enumerate(names)]
    if names == wanted:
        return func
    for block, name in zip(blocks, wanted, strict=True):
        nodes.append({"type": "ffi.String", "data": name})  # a new node: strings are shared
        block["data"]["name_hint"] = len(nodes) - 1
    return tvm.ir.load_json(json.dumps(graph))


def canonical_module(mod: IRModule) -> IRModule:
    """A copy of an IRModule with every TIR function's blocks named canonically (Relax
    functions as they are)."""
    import tvm

    mod = mod.clone()
    for gv, func in list(mod.functions.items()):
        if isinstance(func, tvm.tirx.PrimFunc):
            renamed = canonical(func)
            if not renamed.same_as(func):
                mod.update_func(gv, renamed)
    return mod


def translate(record: JsonList, tuned_on: IRModule, applied_to: IRModule) -> JsonList:
    """A record's JSON (`[trace, ...]`) tuned on the module `tuned_on`, with its blocks renamed
    to those of `applied_to` (a structurally equal module). ValueError when the two modules'
    blocks do not correspond."""
    return translation(tuned_on, applied_to)(record)


def translation(tuned_on: IRModule, applied_to: IRModule) -> Callable[[JsonList], JsonList]:
    """`translate` for many records of one pair of modules (their blocks are read once)."""
    old, new = block_names(tuned_on), block_names(applied_to)
    if old == new:
        return lambda record: record
    if len(old) != len(new) or len(set(old)) != len(old):
        raise ValueError(f"the blocks of the tuned workload ({len(old)}) and of this task "
                         f"({len(new)}) do not correspond")
    rename = dict(zip(old, new, strict=True))
    return lambda record: _renamed(record, rename)


def _renamed(record: JsonList, rename: dict[str, str]) -> JsonList:
    insts, decisions = record[0]
    renamed = []
    for inst in insts:
        kind, inputs, attrs, outputs = inst
        if kind == "GetSBlock" and attrs and attrs[0] in rename:
            attrs = [rename[attrs[0]], *attrs[1:]]
        renamed.append([kind, inputs, attrs, outputs])
    return [[renamed, decisions], *record[1:]]
