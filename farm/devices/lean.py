"""Processes that never read a model do not import torch.

TVM's FFI imports torch whenever it is installed (for tensor interop the farm's workers,
trackers and phones never use): about 2.5 s of CPU in each of those processes on a 2-core
machine, where `import tvm` takes 5 s with it and 2 s without. A worker host without torch
(the `farm` install without the `torch` extra) never pays it; a machine with torch (the
embedded farm, a lab host installed with every extra) pays it in the worker, in every build
and measurement process TVM starts for it (`python -m tvm.exec.popen_worker`), in the
tracker and in each emulated phone and its sessions: ~15 processes for one embedded farm.

`hide_torch()` makes `import torch` fail in this process (when it has not imported torch
yet) and, through PYTHONPATH, in every process it starts: `shadow/torch/__init__.py` raises
ImportError, which TVM takes as "torch is not installed". `without_torch(env)` does the same
for a process started with `env`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SHADOW = str(Path(__file__).resolve().with_name("shadow"))  # holds a torch that will not import


def without_torch(env: dict[str, str]) -> dict[str, str]:
    """`env` (a process's environment) with the shadowing torch first on PYTHONPATH."""
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != SHADOW]
    return {**env, "PYTHONPATH": os.pathsep.join([SHADOW, *path])}


def hide_torch() -> None:
    """No torch in this process (unless it is already imported) nor in the ones it starts."""
    if "torch" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]  # import torch: ImportError
    os.environ["PYTHONPATH"] = without_torch(dict(os.environ))["PYTHONPATH"]
