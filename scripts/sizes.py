"""`make lint`: no module over 400 lines and no function over 60 in farm/ and workers/
(a god module or a function a screen cannot show is split, not grown)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MODULE_LINES = 400
FUNCTION_LINES = 60


def problems(root: Path) -> list[str]:
    out = []
    for path in sorted([*root.glob("farm/**/*.py"), *root.glob("workers/**/*.py")]):
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MODULE_LINES:
            out.append(f"{path}: {lines} lines (at most {MODULE_LINES}): split the module")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if n > FUNCTION_LINES:
                    out.append(f"{path}:{node.lineno}: {node.name} has {n} lines "
                               f"(at most {FUNCTION_LINES}): split the function")
    return out


if __name__ == "__main__":
    found = problems(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
    print("\n".join(found) or "sizes: every module <= 400 lines, every function <= 60")
    sys.exit(1 if found else 0)
