"""A torch.export graph before TVM's frontend reads it: checked for what cannot be deployed
(a model exported in training mode), and rewritten where torch computes implicitly or by an
overload TVM lacks, in operators TVM converts."""

from __future__ import annotations

from types import ModuleType

from farm.core.aliases import ExportedProgram

_ARITH = {"pow", "div", "mul", "add", "sub", "rsub", "true_divide", "maximum", "minimum",
          "floor_divide", "remainder", "fmod", "atan2"}


def alias_overloads(torch: ModuleType, ep: ExportedProgram) -> int:
    """Rewrite div.Scalar_mode, which TVM's frontend lacks, as div.Tensor_mode, which it
    converts: a traced TorchScript's `size // heads` (nn.TransformerEncoderLayer's head size)
    is div.Scalar_mode of an int64 scalar tensor. The scalar becomes a tensor of the
    dividend's dtype (TVM makes a Python int an int32 constant and refuses int64 / int32).
    Returns the nodes rewritten."""
    graph = ep.graph_module.graph
    renamed = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.div.Scalar_mode:
            continue
        x, scalar = node.args[:2]
        val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        dtype = val.dtype if isinstance(val, torch.Tensor) else torch.get_default_dtype()
        with graph.inserting_before(node):
            other = graph.call_function(torch.ops.aten.scalar_tensor.default, (scalar,),
                                        {"dtype": dtype})
        other.meta["val"] = torch.scalar_tensor(scalar, dtype=dtype)
        node.args = (x, other, *node.args[2:])
        node.target = torch.ops.aten.div.Tensor_mode
        renamed += 1
    if renamed:
        ep.graph_module.recompile()
    return renamed


def promote_types(torch: ModuleType, ep: ExportedProgram) -> int:
    """Make torch's int -> float type promotion explicit in arithmetic (TVM does not promote).

    E.g. `(d // heads) ** 0.5` of a traced model is pow(int64 tensor, 0.5) -> float32 in
    torch, which TVM refuses ("power only applies to float"). Returns the casts inserted.
    """
    graph = ep.graph_module.graph
    casts = 0
    for node in list(graph.nodes):
        packet = getattr(node.target, "_overloadpacket", None)
        if node.op != "call_function" or packet is None or packet.__name__ not in _ARITH:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or not val.dtype.is_floating_point:
            continue
        for arg in node.args:
            aval = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
            if isinstance(aval, torch.Tensor) and not aval.dtype.is_floating_point:
                with graph.inserting_before(node):
                    cast = graph.call_function(torch.ops.aten._to_copy.default, (arg,),
                                               {"dtype": val.dtype})
                cast.meta["val"] = aval.to(val.dtype)
                node.replace_input_with(arg, cast)
                casts += 1
    if casts:
        ep.graph_module.recompile()
    return casts


def training_ops(torch: ModuleType, ep: ExportedProgram) -> list[str]:
    """The operators that run as in training: batch norm on the batch's statistics, dropout
    that drops. TVM compiles them for inference (running statistics, no dropout), so such a
    model never matches torch and its tuning is for a model nobody deploys."""
    aten = torch.ops.aten
    flags = {aten.batch_norm.default: 5, aten.dropout.default: 2,  # the `training` argument
             aten.feature_dropout.default: 2, aten.alpha_dropout.default: 2,
             aten._native_batch_norm_legit_functional.default: 5,
             aten._native_batch_norm_legit.default: 5, aten.native_dropout.default: 2}
    found = []
    for node in ep.graph_module.graph.nodes:
        at = flags.get(node.target) if node.op == "call_function" else None
        if at is not None and len(node.args) > at and node.args[at] is True:
            found.append(str(node.target).split(".")[-2] if "." in str(node.target)
                         else str(node.target))
    return sorted(set(found))

