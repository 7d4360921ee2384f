"""A workload's operator family: what its anchor block computes, whatever the shapes.

Two workloads are of one family when their anchor blocks (TVM's `find_anchor_sblock`: the
reduction block with the most work, the one MetaSchedule's tiling rules shape) have the same
structure: as many spatial and reduction loops, the same kind of update (a sum, a max), and
reads and writes of buffers of the same rank indexed the same way per dimension (by one loop
variable, by a window such as `h * stride + kh`, by a constant). A 3x3 convolution of 32
channels and a 1x1 one of 640 are one family (a window of extent 1 is still a window); a
depthwise convolution (no reduction over channels) and a dense layer are others. The name a
model's fusion gave the task says nothing here: "fused_conv2d3_add2" is a depthwise or a full
convolution, with whatever epilogue.

A workload without a reduction (an elementwise or layout op) is of the family of its output's
rank and its inputs' ranks. A schedule carries over between workloads of one family
(workers/metaschedule/transfer.py), and a cost model trained on a family ranks its new workloads where
its held-out check says so (workers/metaschedule/costmodel.py).
"""

from __future__ import annotations

from farm.core.aliases import IRModule, TVMObject


def _index_kind(expr: TVMObject, loops: set[str]) -> str:
    """How one dimension of an access is indexed: by one loop variable (`v`), a constant
    (`k`), or an expression of several (`w`: a window, a stride, a fused index)."""
    import tvm

    if isinstance(expr, tvm.tirx.Var):
        return "v" if expr.name in loops else "x"
    if isinstance(expr, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
        return "k"
    return "w"


def _region(region: TVMObject, loops: set[str]) -> str:
    return "".join(_index_kind(r.min, loops) for r in region.region) or "0"


def _update(block: TVMObject) -> str:
    """The kind of the anchor's update: the top operator of what it stores (Add for a sum)."""
    import tvm

    body = block.body
    if isinstance(body, tvm.tirx.BufferStore):
        return type(body.value).__name__
    return type(body).__name__


def signature(block: TVMObject) -> str:
    """One block's structure as text: loops (s spatial, r reduction, o other), update, the
    index kinds of each write and read (reads sorted: their order is the frontend's)."""
    kinds = {0: "s", 2: "r"}
    loops = "".join(sorted(kinds.get(int(iv.iter_type), "o") for iv in block.iter_vars))
    names = {iv.var.name for iv in block.iter_vars}
    writes = ",".join(f"{_region(w, names)}/{getattr(w.source, 'dtype', '')}"
                      for w in block.writes)
    reads = ",".join(sorted(_region(r, names) for r in block.reads))
    return f"{loops}|{_update(block)}|w:{writes}|r:{reads}"


def _output_block(mod: IRModule) -> TVMObject | None:
    """The block that writes the function's output (the last, where there are several)."""
    from tvm.s_tir import Schedule

    try:
        sch = Schedule(mod)
        outputs = sch.get_output_blocks(sch.get_sblock("root"))
        return sch.get(outputs[-1]) if outputs else None
    except Exception:  # noqa: BLE001 - a module without a root block (not MetaSchedule's)
        return None


def family(mod: IRModule) -> str:
    """The operator family of a workload's TIR module (see the module's doc)."""
    from tvm.s_tir.analysis import find_anchor_sblock

    anchor = find_anchor_sblock(mod)
    if anchor is not None:
        return "reduce:" + signature(anchor)
    out = _output_block(mod)
    return "map:" + signature(out) if out is not None else "opaque"
