"""`make lint`: the rules of the tree that import-linter and ruff cannot check.

- no module over 600 lines and no function over 60 in farm/ and workers/ (a god module or a
  function a screen cannot show is split, not grown). The module cap was 400 until
  2026-12-07: the ten largest modules sat just under it and one concept was split to pass it
  (issue 49); 600 still catches a module that holds two, and a split follows the concepts;
- only farm/core/config.py reads a FARM_* variable (and farm/core/secrets.py, the *_FILE
  secrets it reads for config); everything else is given the config;
- the farm's own modules are imported at a module's top, where the real graph shows; one
  imported inside a function says why beside it (a comment on its line or the line above),
  or its module says once why its functions import (a line `# Imports inside functions: ...`:
  the CLI loads a command's modules when it runs). Import cycles are refused by
  tests/unit/test_import_cycles.py, so "a cycle" is never the reason; a heavy import
  (TVM, numpy, redis) that the module's other users need not pay for is.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

MODULE_LINES = 600
FUNCTION_LINES = 60
ENV_READERS = {"farm/core/config.py", "farm/core/secrets.py"}
ENV_READ = re.compile(r"""(environ(\.get)?\s*[\[(]|getenv\s*\()\s*f?["']FARM_""")
LAZY_REASON = "# Imports inside functions:"
OURS = ("farm", "workers")


def unexplained_imports(path: Path, text: str) -> list[str]:
    """The farm's own modules imported inside a function without a reason beside them."""
    if any(line.startswith(LAZY_REASON) for line in text.splitlines()):
        return []
    lines, out = text.splitlines(), []
    for fn in ast.walk(ast.parse(text)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if not any(name.split(".")[0] in OURS for name in names):
                continue
            above = node.lineno - 2  # a comment above the run of imports it is in says it
            while above >= 0 and lines[above].strip().startswith(("from ", "import ")):
                above -= 1
            said = "#" in lines[node.lineno - 1] or lines[above].strip().startswith("#")
            if not said:
                out.append(f"{path}:{node.lineno}: {names[0]} imported inside {fn.name} without "
                           "a reason: import it at the top, or say why beside it")
    return out


def problems(root: Path) -> list[str]:
    out = []
    for path in sorted([*root.glob("farm/**/*.py"), *root.glob("workers/**/*.py")]):
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MODULE_LINES:
            out.append(f"{path}: {lines} lines (at most {MODULE_LINES}): split the module")
        rel = path.relative_to(root).as_posix()
        for n, line in enumerate(text.splitlines(), 1):
            if rel not in ENV_READERS and ENV_READ.search(line):
                out.append(f"{path}:{n}: reads a FARM_* variable: take it from the config "
                           "(farm/core/config.py is the one reader)")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if n > FUNCTION_LINES:
                    out.append(f"{path}:{node.lineno}: {node.name} has {n} lines "
                               f"(at most {FUNCTION_LINES}): split the function")
        out.extend(unexplained_imports(path, text))
    return out


if __name__ == "__main__":
    found = problems(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
    print("\n".join(found) or "rules: modules <= 600 lines, functions <= 60, FARM_* read by "
          "the config only, imports inside functions say why")
    sys.exit(1 if found else 0)
