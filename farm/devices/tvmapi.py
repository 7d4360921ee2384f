"""TVM's private parts the farm relies on, in one place, checked against the pinned TVM.

TVM 0.27 (apache-tvm 0.27.0.post1) offers no public way to do a few things the farm needs:
build a candidate in a warm process with MetaSchedule's own build-and-export step, run
TVM's RPC server and tracker in this process (not in a second Python), survive a crashed
session, slow a phone's sessions down, and tell whether only TVM's runtime is loaded. Each
is reached here and nowhere else. `problems()` says, in one line each, what the installed
TVM no longer has as the farm expects it; `tests/unit/test_tvmapi.py` fails with those
lines, so an upgrade says where it breaks before any job does.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from farm.core.aliases import IRModule, RuntimeModule, Target, TVMObject

R = TypeVar("R")

# (module, attribute, the parameters the farm passes, in order): what each use expects
EXPECTED: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("tvm.s_tir.meta_schedule.builder.local_builder", "_serialize_params", ("params",)),
    ("tvm.s_tir.meta_schedule.builder.local_builder", "_worker_func",
     ("_f_build", "_f_export", "mod", "target", "params")),
    ("tvm.rpc.server", "_serving", ("sock", "addr", "opts", "load_library")),
    ("tvm.rpc.server", "_server_env", ("load_library", "work_path")),
    ("tvm.rpc.server", "PopenRPCServerState",
     ("self", "host", "port", "port_end", "is_proxy", "tracker_addr", "key", "load_library",
      "custom_addr")),
    ("tvm.rpc.tracker", "PopenTrackerServerState", ("self", "host", "port", "port_end",
                                                    "silent")),
    ("tvm.base", "_RUNTIME_ONLY", ()),
    # the runner subclasses RPCRunner's Python class (the registered one is a wrapper)
    ("tvm.s_tir.meta_schedule.runner.rpc_runner", "RPCRunner._cls",
     ("self", "rpc_config", "evaluator_config", "cooldown_sec")),
    # the key's cost model trains XGBModel's pack-sum booster on the store's features
    ("tvm.s_tir.meta_schedule.cost_model.xgb_model", "XGBModel._cls._train",
     ("self", "xs", "ys")),
    # importing it registers TVM's FLOP estimator for TIR
    ("tvm.s_tir.meta_schedule", "_ffi_api", ()),
)


def _get(module: str, name: str) -> TVMObject:
    found = importlib.import_module(module)
    for part in name.split("."):  # a class's attribute: "RPCRunner._cls"
        found = getattr(found, part)
    return found


def problems() -> list[str]:
    """What the installed TVM lacks or has changed of EXPECTED, one line each (empty: all
    as the farm expects)."""
    out = []
    for module, name, params in EXPECTED:
        try:
            obj = _get(module, name)
        except (ImportError, AttributeError) as e:
            out.append(f"{module}.{name} is gone ({e}): the farm's use of it needs a rewrite")
            continue
        if not params:
            continue
        target = obj.__init__ if inspect.isclass(obj) else obj
        have = tuple(inspect.signature(target).parameters)
        if have[:len(params)] != params:
            out.append(f"{module}.{name} now takes {have}, the farm passes {params}")
    return out


# --- the uses ---------------------------------------------------------------------------
def serialize_params(params: object) -> object:
    """MetaSchedule's LocalBuilder: a build input's params, as its build processes take them."""
    return _get("tvm.s_tir.meta_schedule.builder.local_builder", "_serialize_params")(params)


def build_and_export(f_build: Callable[[IRModule, Target, object], RuntimeModule],
                     f_export: Callable[[RuntimeModule], str] | None, mod: IRModule,
                     target: Target, params: object) -> str:
    """MetaSchedule's LocalBuilder's work in a build process: build, export, the path."""
    return _get("tvm.s_tir.meta_schedule.builder.local_builder", "_worker_func")(
        f_build, f_export, mod, target, params)


def wrap_serving(wrapper: Callable[[Callable[..., None]], Callable[..., None]]) -> None:
    """Replace the RPC server's per-connection `_serving(sock, addr, opts, load_library)`
    with `wrapper(original)` (in this process: the server it starts uses it)."""
    _wrap("tvm.rpc.server", "_serving", wrapper)


def wrap_server_env(wrapper: Callable[[Callable[..., object]], Callable[..., object]]) -> None:
    """Replace the RPC server's per-session `_server_env(load_library, work_path=None)`
    (which registers a session's `tvm.rpc.server.*` functions) with `wrapper(original)`."""
    _wrap("tvm.rpc.server", "_server_env", wrapper)


def _wrap(module: str, name: str, wrapper: Callable[[Callable[..., R]], Callable[..., R]]) -> None:
    found = importlib.import_module(module)
    setattr(found, name, wrapper(getattr(found, name)))


class ServerState(Protocol):
    """TVM's RPC server or tracker, serving in `thread` of this process."""

    thread: threading.Thread


def rpc_server_state(*args: object, **kwargs: object) -> ServerState:
    """TVM's RPC server, run in this process (what its PopenWorker runs in a second one)."""
    cls = _get("tvm.rpc.server", "PopenRPCServerState")
    state = cls(*args, **kwargs)
    cls.current = state  # held, as TVM's PopenWorker does
    return state


def tracker_server_state(*args: object, **kwargs: object) -> ServerState:
    """TVM's RPC tracker, run in this process."""
    return _get("tvm.rpc.tracker", "PopenTrackerServerState")(*args, **kwargs)


def rpc_runner_class() -> type:
    """MetaSchedule's RPCRunner as a Python class to subclass (`RPCRunner` itself is TVM's
    registered wrapper around it)."""
    return _get("tvm.s_tir.meta_schedule.runner.rpc_runner", "RPCRunner._cls")  # type: ignore[no-any-return]


def xgb_train(model: TVMObject, xs: Sequence[object], ys: object) -> None:
    """Train XGBModel `model` on feature groups `xs` and normalized throughputs `ys` with its
    own pack-sum objective (what its `update` does after measuring, without the records)."""
    model._train(xs=xs, ys=ys)  # noqa: SLF001 - in EXPECTED


def xgb_update(model: TVMObject, context: object, candidates: Sequence[object],
               results: Sequence[object], train: bool = True) -> None:
    """XGBModel `model`'s `update` (the candidates' features and costs added to its data);
    with `train` False, without retraining its booster after it: its adaptive-training check
    (`adaptive_training`, `last_train_size`: public attributes of its own, not parameters) is
    made to skip for this call, and left as it was."""
    if train:
        model.update(context, candidates, results)
        return
    saved = (model.adaptive_training, model.last_train_size)
    model.adaptive_training, model.last_train_size = True, 1 << 62
    try:
        model.update(context, candidates, results)
    finally:
        model.adaptive_training, model.last_train_size = saved


def register_flop_estimator() -> None:
    """Import what registers TVM's FLOP estimator of TIR (`estimate_tir_flops`)."""
    _get("tvm.s_tir.meta_schedule", "_ffi_api")


def compiler_loaded() -> bool:
    """Has this process loaded TVM with its compiler (not TVM's runtime library only)?"""
    tvm = sys.modules.get("tvm")
    return tvm is not None and not tvm.base._RUNTIME_ONLY
