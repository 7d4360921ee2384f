"""Inference batch norms folded into the convolutions before them.

A trained CNN runs a batch norm after nearly every convolution. TVM's frontend imports it as
`nn.batch_norm`, which DecomposeOpsForInference turns into four element-wise operations per
output (subtract the mean, divide by the deviation, scale, shift) that the fused kernel then
computes on every output: against the 9 multiply-adds of a 3x3 depthwise convolution, or the
16 of a 1x1 convolution over 16 channels, that is a large share of the kernel. With the
convolution's weights and the norm's statistics constant, the norm is a per-channel scale of
the weights and a shift: conv(x, W) [+ b] -> BN  ==  conv(x, W * s) + (b - mean) * s + beta,
s = gamma / sqrt(var + eps) (what every inference compiler does; torch eager does not).

Folded only where it is exact to float rounding: NC* data layouts with the norm on axis 1,
O* kernel layouts (the output channel first, any groups), constant weights and statistics,
float32/float64, and intermediate results used by nothing else.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from farm.core.aliases import IRModule, RelaxExpr, TVMObject

log = logging.getLogger(__name__)

_CONVS = ("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d")
_FLOATS = ("float32", "float64")


class Fold(NamedTuple):
    """A batch norm folded: its convolution, the scaled weights and the shift (constants)."""

    conv: RelaxExpr
    weight: RelaxExpr
    shift: RelaxExpr


Plans = dict[RelaxExpr, Fold]  # a batch norm's var -> its fold
Users = dict[RelaxExpr, list[RelaxExpr]]  # a var -> the vars that use it (relax udchain)


def fold_batch_norm(mod: IRModule) -> IRModule:
    """The module with every foldable inference batch norm folded into its convolution."""
    from tvm import relax

    given, mod = mod, relax.transform.FoldConstant()(mod)  # a bias reshaped: a constant
    plans: Plans = {}
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            for block in func.body.blocks:
                if isinstance(block, relax.DataflowBlock):
                    plans.update(_plan(block))
    if not plans:
        return given
    folder = _folder()(mod, plans)
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mod[gv] = folder.visit_expr(func)
    log.info("folded %d batch norm(s) into their convolutions", len(plans))
    return relax.transform.DeadCodeElimination()(mod)


def _plan(block: TVMObject) -> Plans:
    """Batch-norm var -> (the convolution, its scaled weights and the shift, as constants)."""
    from tvm import relax

    values = {b.var: b.value for b in block.bindings}
    users = relax.analysis.udchain(block)
    plans = {}
    for var, value in values.items():
        if not (isinstance(value, relax.Call) and _op(value) == "relax.nn.batch_norm"):
            continue
        folded = _fold(var, value, values, users)
        if folded is not None and all(
                isinstance(values.get(u), relax.TupleGetItem) and values[u].index == 0
                for u in users.get(var, [])):
            plans[var] = folded
    return plans


def _op(call: RelaxExpr) -> str:
    return str(getattr(call.op, "name", ""))


def _only_user(var: RelaxExpr, user: RelaxExpr, users: Users) -> bool:
    found = list(users.get(var, []))
    return len(found) == 1 and found[0].same_as(user)


def _fold(bn_var: RelaxExpr, bn: RelaxExpr, values: dict[RelaxExpr, RelaxExpr],
          users: Users) -> Fold | None:
    from tvm import relax
    from tvm.ir.expr import Constant

    attrs = bn.attrs
    if int(attrs.axis) != 1 or bool(getattr(attrs, "training", False)):
        return None
    src, *stats = bn.args
    if not (isinstance(src, relax.Var) and all(isinstance(s, Constant) for s in stats)):
        return None
    if not _only_user(src, bn_var, users):
        return None
    conv, bias = values.get(src), None
    if isinstance(conv, relax.Call) and _op(conv) == "relax.add" and \
            isinstance(conv.args[1], Constant) and isinstance(conv.args[0], relax.Var):
        bias, conv_var = conv.args[1], conv.args[0]
        if not _only_user(conv_var, src, users):
            return None
        conv = values.get(conv_var)
    if not (isinstance(conv, relax.Call) and _op(conv) in _CONVS
            and isinstance(conv.args[1], Constant)):
        return None
    ca = conv.attrs
    if not (str(ca.data_layout).startswith("NC") and str(ca.kernel_layout).startswith("O")
            and str(ca.out_layout).startswith("NC")):
        return None
    return _scaled(conv, bias, stats, float(attrs.epsilon), bool(attrs.center),
                   bool(attrs.scale))


def _scaled(conv: RelaxExpr, bias: RelaxExpr | None, stats: list[RelaxExpr], eps: float,
            center: bool, scale: bool) -> Fold | None:
    import numpy as np
    from tvm import relax

    weight = conv.args[1].value.numpy()
    if str(weight.dtype) not in _FLOATS:
        return None
    gamma, beta, mean, var = (s.value.numpy().astype("float64") for s in stats)
    channels = weight.shape[0]
    if any(a.shape != (channels,) for a in (gamma, beta, mean, var)):
        return None
    b = np.zeros(channels)
    if bias is not None:
        raw = bias.value.numpy()
        if raw.size != channels or (raw.ndim > 1 and raw.shape[1] != channels):
            return None  # not one value per output channel on axis 1
        b = raw.reshape(channels).astype("float64")
    s = (gamma if scale else np.ones(channels)) / np.sqrt(var + eps)
    shift = (b - mean) * s + (beta if center else 0.0)
    ones = (1,) * (weight.ndim - 1)  # the weight's rank is the output's: (N, C, spatial...)
    w = weight.astype("float64") * s.reshape((channels, *ones))
    return Fold(conv, relax.const(w.astype(weight.dtype)),
                relax.const(shift.astype(weight.dtype).reshape((1, channels, *ones[1:]))))


def _folder() -> type:
    from tvm import relax

    @relax.expr_functor.mutator
    class Folder(relax.PyExprMutator):
        def __init__(self, mod: IRModule, plans: Plans) -> None:
            super().__init__(mod)
            self.plans = plans

        def visit_tuple_getitem_(self, op: RelaxExpr) -> RelaxExpr:
            plan = self.plans.get(op.tuple_value) if op.index == 0 else None
            if plan is None:
                return super().visit_tuple_getitem_(op)
            conv, weight, shift = plan
            x = self.visit_expr(conv.args[0])
            out = self.builder_.emit(relax.Call(conv.op, [x, weight], conv.attrs, conv.ty_args))
            return relax.op.add(out, shift)

    return Folder
