"""A tuning task's TIR module, back from the TVM JSON it crosses processes as."""

from __future__ import annotations

from farm.core.aliases import IRModule
from farm.core.messages import TuneTask


def load_mod(task: TuneTask) -> IRModule:
    """The task's TIR IRModule back from its TVM JSON."""
    import tvm

    return tvm.ir.load_json(task.mod_json)
