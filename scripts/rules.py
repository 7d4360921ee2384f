"""`make lint`: the rules of the tree that import-linter and ruff cannot check.

- no module over 600 lines and no function over 60 in farm/ and workers/ (a god module or a
  function a screen cannot show is split, not grown). The module cap was 400 until
  2026-12-07: the ten largest modules sat just under it and one concept was split to pass it
  (issue 49); 600 still catches a module that holds two, and a split follows the concepts;
- only farm/core/config.py reads a FARM_* variable (and farm/core/secrets.py, the *_FILE
  secrets it reads for config); everything else is given the config.
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
    return out


if __name__ == "__main__":
    found = problems(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
    print("\n".join(found) or "rules: modules <= 600 lines, functions <= 60, FARM_* read by "
          "the config only")
    sys.exit(1 if found else 0)
