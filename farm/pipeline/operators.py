"""What a model's graph may run before the user has said they trust it: torch's operators
that compute, never ones that reach files, storages, other processes or the network.

A TorchScript file is a program: its forward can call `torch.from_file(path, shared=True)`
and `copy_` into it (a file of the user's written), or `torch.save`; a .pt2's graph can hold
`aten.from_file` the same way. Ingest runs the model (to check it and time torch), so a
graph is read here first, node by node, and every operator must be one of torch's own
(`aten`, `prim`, `prims`) whose schema takes no storage and no file name, and no call may
be left to a Python function or a C++ class (what TorchScript cannot inline). Anything else
needs the user's opt-in (`--allow-pickle`: "I trust this file's code").

The functions take the torch module as an argument: only ingest imports torch.
"""

from __future__ import annotations

from types import ModuleType

from farm.core.aliases import TVMObject

NAMESPACES = frozenset({"aten", "prim", "prims"})
# Never without the opt-in: a call to Python, to a method or function TorchScript could not
# inline (a C++ class's), or an operator that names a file
REFUSED = frozenset({"prim::PythonOp", "prim::CallMethod", "prim::CallFunction",
                     "aten::save", "aten::from_file"})
# torch.export's higher-order operators whose bodies are subgraphs of the same program
# (each subgraph is checked like the main one), and the Python built-ins of symbolic shapes
HIGHER_ORDER = frozenset({"cond", "while_loop", "map_impl", "scan"})
BUILTIN_MODULES = frozenset({"_operator", "operator", "math"})
TS_CLASSES = "torch.classes"  # a C++ class's object: its methods run native code


def op_problem(torch: ModuleType, name: str) -> str | None:
    """Why the operator `name` (`aten::add`, `aten::from_file`) may not run before the user
    trusts the file, or None."""
    namespace = name.split("::", 1)[0]
    if namespace not in NAMESPACES:
        return f"{name} (an operator outside torch's own)"
    if name in REFUSED:
        return f"{name} (reads or writes files, or calls out of TorchScript)"
    for schema in torch._C._jit_get_schemas_for_operator(name):
        types = [str(a.type) for a in schema.arguments] + [str(r.type) for r in schema.returns]
        if any("Storage" in t for t in types) or any(a.name == "filename"
                                                      for a in schema.arguments):
            return f"{name} (reaches a storage or a file)"
    return None


def torchscript_problems(torch: ModuleType, module: TVMObject) -> list[str]:
    """What the methods of a loaded TorchScript module (and its submodules) would run that
    `op_problem` refuses, or that holds a C++ class's object, one line each (empty: none)."""
    found: set[str] = set()
    for _, sub in module.named_modules():
        graphs = [sub._c._get_method(m).graph for m in sub._c._method_names()]
        # forward hooks are functions of their own, run around forward: checked as well
        graphs += [h.graph for h in (*sub._c._get_forward_hooks(),
                                     *sub._c._get_forward_pre_hooks())]
        for graph in graphs:
            graph = graph.copy()
            torch._C._jit_pass_inline(graph)
            _graph_problems(torch, graph.nodes(), found)
    return sorted(found)


def _graph_problems(torch: ModuleType, nodes: TVMObject, found: set[str]) -> None:
    for node in nodes:
        kind = node.kind()
        if kind not in _HARMLESS:
            problem = op_problem(torch, kind)
            if problem is not None:
                found.add(problem)
        for value in node.outputs():
            if TS_CLASSES in str(value.type()):
                found.add(f"{value.type()} (a C++ class's object)")
        for block in node.blocks():
            _graph_problems(torch, block.nodes(), found)


# prim nodes of every graph that have no schema to read (constants, lists, control flow)
_HARMLESS = frozenset({
    "prim::Constant", "prim::GetAttr", "prim::SetAttr", "prim::ListConstruct",
    "prim::ListUnpack", "prim::TupleConstruct", "prim::TupleUnpack", "prim::TupleIndex",
    "prim::DictConstruct", "prim::If", "prim::Loop", "prim::Return", "prim::RaiseException",
    "prim::Uninitialized", "prim::unchecked_cast", "prim::NumToTensor", "prim::device",
    "prim::dtype", "prim::layout", "prim::requires_grad", "prim::is_cuda", "prim::shape",
    "prim::min", "prim::max", "prim::data", "prim::Print", "prim::CreateObject",
    "prim::isinstance", "prim::TypeCheck", "prim::Enter", "prim::Exit", "prim::Guard",
    "prim::BailOut", "prim::AutogradZero", "prim::grad", "prim::EnumValue", "prim::EnumName",
})


def export_problems(torch: ModuleType, program: TVMObject) -> list[str]:
    """What the graph of a torch.export program (and its subgraphs) calls that `op_problem`
    refuses, or that is no operator of torch's at all, one line each (empty: none)."""
    found: set[str] = set()
    for gm in program.graph_module.modules():
        graph = getattr(gm, "graph", None)
        if graph is None:
            continue
        for node in graph.nodes:
            if node.op != "call_function":
                continue
            problem = _target_problem(torch, node.target)
            if problem is not None:
                found.add(problem)
    return sorted(found)


def _target_problem(torch: ModuleType, target: object) -> str | None:
    if isinstance(target, torch._ops.OpOverload):
        return op_problem(torch, target._schema.name)
    if isinstance(target, torch._ops.HigherOrderOperator):
        if target.name() in HIGHER_ORDER:
            return None
        return f"{target.name()} (a higher-order operator the farm does not know)"
    module = getattr(target, "__module__", None)
    name = getattr(target, "__name__", repr(target))
    if module in BUILTIN_MODULES or (module == "torch" and name.startswith("sym_")):
        return None
    return f"{module}.{name} (a Python function, not a torch operator)"
