"""A tuning task's TIR module, back from the TVM JSON it crosses processes as."""

from __future__ import annotations

from typing import Any

from farm.core.messages import TuneTask


def load_mod(task: TuneTask) -> Any:
    """The task's TIR IRModule back from its TVM JSON."""
    import tvm

    return tvm.ir.load_json(task.mod_json)
