"""No import cycles in the farm's code (farm/, workers/): every `import` a module runs, at its
top or inside a function, counts; an import under `if TYPE_CHECKING:` does not (it never
runs: it names a type for the checker). A cycle hides the real order of the parts and breaks
at import time as soon as one side imports the other at its top."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _modules(root: Path) -> dict[str, Path]:
    out = {}
    for top in ("farm", "workers"):
        for path in (root / top).rglob("*.py"):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def _type_checking(node: ast.AST) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Name | ast.Attribute)
            and ast.unparse(node.test).endswith("TYPE_CHECKING"))


def _imports(tree: ast.AST) -> list[str]:
    """The modules `tree` imports when it runs (not under `if TYPE_CHECKING:`)."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if _type_checking(node):
            for child in node.orelse:  # the `else:` of TYPE_CHECKING runs
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import name`: the module pkg.name when it is one, else pkg
            found.extend(f"{node.module}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    mods = _modules(root)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for imported in _imports(ast.parse(path.read_text())):
            while imported and imported not in mods:  # a name in a module: the module
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                graph[name].add(imported)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_farm_has_no_import_cycle():
    assert cycles(import_graph(ROOT)) == []


def test_a_cycle_is_found_a_type_only_import_is_not(tmp_path):
    (tmp_path / "farm").mkdir()
    (tmp_path / "workers").mkdir()
    (tmp_path / "farm" / "a.py").write_text("from farm.b import x\n")
    (tmp_path / "farm" / "b.py").write_text("def f():\n    from farm.c import y\n")
    (tmp_path / "farm" / "c.py").write_text("import farm.a\n")
    (tmp_path / "farm" / "d.py").write_text("from typing import TYPE_CHECKING\n"
                                            "if TYPE_CHECKING:\n    from farm.e import T\n")
    (tmp_path / "farm" / "e.py").write_text("from farm.d import U\n")
    assert cycles(import_graph(tmp_path)) == [["farm.a", "farm.b", "farm.c"]]
