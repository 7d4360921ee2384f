"""Stage 1, ingest: a model file -> torch.export -> Relax IRModule, plus torch's own answer.

The only module that imports torch. Formats:

- `.pt2` (torch.export.save): input shapes come from the file unless given.
- TorchScript (`torch.jit.save`): needs `--input-shape`; converted with TS2EPConverter.
- a pickled `nn.Module` (`torch.save(model)`): only with `--allow-pickle`, because
  unpickling runs code from the file.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from farm.core.aliases import IRModule
from farm.core.errors import ExtractError, IngestError, UsageError
from farm.pipeline.modelfile import (
    PICKLE_HINT,
    PICKLE_REFUSED,
    listed,
    refuse_code,
    sniff_format,
    tensors_only,
)
from farm.pipeline.operators import export_problems, torchscript_problems
from farm.pipeline.rewrite import alias_overloads, promote_types, training_ops

if TYPE_CHECKING:  # torch is imported when a model is read, not with this module
    from torch import SymInt, Tensor
    from torch.export import ExportedProgram
    from torch.nn import Module

log = logging.getLogger(__name__)

DTYPES = ("float32", "float16", "int64", "int32")


@dataclass
class ModelBundle:
    """What ingest hands on: the Relax module, the inputs used, and torch's outputs and latency."""

    name: str
    path: str
    fmt: str  # "torch.export" | "torchscript" | "pickle"
    mod: IRModule  # the model as a Relax module
    inputs: list[np.ndarray]
    outputs: list[np.ndarray]
    torch_us: float
    torch_threads: int


# inputs are made here (random, seeded) and fed to torch and to the compiled model; a shape
# beyond this is a typo (1,3,100000,100000 is 112 GiB as float32), refused before allocating
MAX_INPUT_BYTES = 1 << 30


def parse_shapes(text: str | None) -> list[tuple[int, ...]] | None:
    """'1,3,224,224' or '1,3,224,224;1,10' (one shape per input) -> shapes; None: not given."""
    if text is None:
        return None
    if text.strip() == "":
        raise UsageError("--input-shape is empty",
                         hint="e.g. --input-shape 1,3,224,224 (';' between inputs), or leave it "
                              "out for a .pt2")
    shapes = []
    for part in text.replace(" ", "").split(";"):
        try:  # every dim an integer: "1,x,3" and "1,,3" are typos, not the shape 1,3
            dims = tuple(int(d) for d in re.split(r"[,x]", part.lower()))
        except ValueError as e:
            raise UsageError(f"bad --input-shape {text!r}: dims must be integers",
                             hint="e.g. --input-shape 1,3,224,224 (';' between inputs)") from e
        if not dims or any(d <= 0 for d in dims):
            raise UsageError(f"bad --input-shape {text!r}: dims must be positive integers",
                             hint="e.g. --input-shape 1,3,224,224")
        shapes.append(dims)
    return shapes


def parse_dtypes(dtype: str, inputs: int) -> list[str]:
    """--dtype: one dtype for every input, or one per input (';' between, as --input-shape:
    a TorchScript language model takes int64 token ids and a float32 mask)."""
    dtypes = [d.strip() for d in dtype.split(";")]
    for d in dtypes:
        if d not in DTYPES:
            raise UsageError(f"unknown --dtype {d!r}", hint=f"one of {', '.join(DTYPES)} "
                                                            "(';' between inputs)")
    if len(dtypes) == 1:
        return dtypes * inputs
    if len(dtypes) != inputs:
        raise UsageError(f"--dtype gives {len(dtypes)} dtypes for {inputs} input(s)",
                         hint="one dtype for all inputs, or one per --input-shape shape")
    return dtypes


def check_inputs(shapes: list[tuple[int, ...]] | None, dtype: str) -> None:
    """Refuse an unknown dtype, or inputs too large to make (before any is allocated)."""
    dtypes = parse_dtypes(dtype, len(shapes) if shapes is not None else 1)
    if shapes is None:
        return
    nbytes = sum(math.prod(s) * np.dtype(d).itemsize for s, d in zip(shapes, dtypes, strict=True))
    if nbytes > MAX_INPUT_BYTES:
        shown = "; ".join(",".join(map(str, s)) for s in shapes)
        raise UsageError(f"--input-shape {shown} makes {nbytes / 2**30:,.1f} GiB of {dtype} "
                         f"inputs; the limit is {MAX_INPUT_BYTES / 2**30:.0f} GiB",
                         hint="tune at the shape the model is deployed with")


def _make_inputs(shapes: list[tuple[int, ...]], dtype: str, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for shape in shapes:
        if dtype.startswith("int"):
            out.append(rng.integers(0, 10, size=shape).astype(dtype))
        else:
            out.append(rng.standard_normal(shape).astype(dtype))
    return out


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def load(
    path: str | Path,
    input_shapes: list[tuple[int, ...]] | None = None,
    dtype: str = "float32",
    allow_pickle: bool = False,
    threads: int = 1,
    timing_runs: int = 50,
) -> ModelBundle:
    """Read a model file, run it in torch, export it, and import it into TVM Relax."""
    path = Path(path)
    check_inputs(input_shapes, dtype)
    fmt = sniff_format(path)
    try:
        import torch
    except ImportError as e:
        raise IngestError("torch is not installed on this host", subject=str(path),
                          hint="run `pip install tunefarm[torch]` (workers do not need it)") from e
    torch.set_num_threads(threads)
    ep, args = _to_exported_program(torch, path, fmt, input_shapes, dtype, allow_pickle)
    if training := training_ops(torch, ep):
        raise UsageError(f"the model runs in training mode ({', '.join(training)}): TVM compiles "
                         "it for inference, so it would never match torch", subject=str(path),
                         hint="call model.eval() before torch.export.export / torch.jit.trace")
    inputs = [a.detach().cpu().numpy() for a in args]
    module = ep.module()
    with torch.no_grad():
        try:
            out = module(*args)
        except Exception as e:  # noqa: BLE001 - the model's own error, named
            raise IngestError(f"the exported model fails on inputs {[list(i.shape) for i in inputs]}: "
                              f"{_first_line(e)}", subject=str(path)) from e
        outputs = [o.detach().cpu().numpy() for o in _flatten(torch, out)]
        torch_us = _time_torch(module, args, timing_runs)
    alias_overloads(torch, ep)  # farm/pipeline/rewrite.py: what TVM's frontend lacks
    promote_types(torch, ep)
    mod = _to_relax(ep, path)
    return ModelBundle(name=path.stem, path=str(path), fmt=fmt, mod=mod, inputs=inputs,
                       outputs=outputs, torch_us=torch_us, torch_threads=threads)


def _flatten(torch: ModuleType, out: object) -> list[Tensor]:
    """The model's output tensors in the order torch.export flattens them (its pytree: a dict
    in insertion order), which is the order of the imported model's outputs."""
    from torch.utils import _pytree

    leaves = _pytree.tree_leaves(out)
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            raise IngestError(f"unsupported model output type {type(leaf).__name__}")
    return leaves


def _time_torch(module: Module, args: tuple[Tensor, ...], runs: int) -> float:
    for _ in range(3):
        module(*args)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        module(*args)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _to_exported_program(torch: ModuleType, path: Path, fmt: str,
                         shapes: list[tuple[int, ...]] | None, dtype: str,
                         allow_pickle: bool) -> tuple[ExportedProgram, tuple[Tensor, ...]]:
    """The model as a torch.export program, and example inputs of its shapes."""
    if fmt == "torch.export":
        return _from_export(torch, path, shapes, allow_pickle)
    if shapes is None:
        raise UsageError(f"a {fmt} model needs --input-shape (e.g. --input-shape 1,3,224,224)",
                         subject=str(path))
    args = tuple(torch.from_numpy(_make_inputs([s], d, seed=i)[0])
                 for i, (s, d) in enumerate(zip(shapes, parse_dtypes(dtype, len(shapes)),
                                                strict=True)))
    if fmt == "torchscript":
        return _from_torchscript(torch, path, args, allow_pickle), args
    return _from_pickle(torch, path, args, allow_pickle), args


def _from_export(torch: ModuleType, path: Path, shapes: list[tuple[int, ...]] | None,
                 allow_pickle: bool) -> tuple[ExportedProgram, tuple[Tensor, ...]]:
    try:
        with contextlib.nullcontext() if allow_pickle else tensors_only(torch, path):
            ep = torch.export.load(str(path))
    except UsageError:
        raise
    except Exception as e:  # noqa: BLE001
        raise IngestError(f"torch.export.load failed (truncated or corrupt?): {_first_line(e)}",
                          subject=str(path)) from e
    if not allow_pickle:  # before the program first runs
        _refuse_ops(export_problems(torch, ep), "torch.export", path)
    user_inputs = [n for n in ep.graph.nodes if n.op == "placeholder"
                   and n.name in set(ep.graph_signature.user_inputs)]
    dims = [list(n.meta["val"].shape) for n in user_inputs]  # an int, or a SymInt where dynamic
    file_shapes = [tuple(_hint(d) for d in ds) for ds in dims]
    if shapes is not None:
        _check_shapes(ep, path, shapes, dims)
    dtypes = [str(n.meta["val"].dtype).replace("torch.", "") for n in user_inputs]
    want = shapes if shapes is not None else file_shapes
    args = tuple(torch.from_numpy(_make_inputs([s], d, seed=i)[0])
                 for i, (s, d) in enumerate(zip(want, dtypes, strict=True)))
    if any(not isinstance(d, int) for ds in dims for d in ds):
        # MetaSchedule tunes static shapes: a dynamic program is specialized to the shapes
        # tuned for (--input-shape, or the export's example), as the TorchScript path does
        log.info("%s: dynamic input dims specialized to %s", path, [list(s) for s in want])
        try:
            ep = torch.export.export(ep.module(), args)
        except Exception as e:  # noqa: BLE001
            raise IngestError(f"the dynamic program cannot be specialized to "
                              f"{[list(s) for s in want]}: {_first_line(e)}",
                              subject=str(path)) from e
    return ep, args


def _hint(d: int | SymInt) -> int:
    return d if isinstance(d, int) else int(d.node.hint)


def _check_shapes(ep: ExportedProgram, path: Path, shapes: list[tuple[int, ...]],
                  dims: list[list[int | SymInt]]) -> None:
    """--input-shape against the program's inputs: a static dim must match, a dynamic one be
    within the range it was exported with."""
    if len(shapes) != len(dims):
        raise UsageError(f"the model takes {len(dims)} input(s), --input-shape "
                         f"gives {len(shapes)}", subject=str(path))
    for i, (want, have) in enumerate(zip(shapes, dims, strict=True)):
        shown = [_hint(d) if isinstance(d, int) else str(d) for d in have]
        if len(want) != len(have):
            raise UsageError(f"input {i} has rank {len(have)} {shown}, --input-shape "
                             f"gives rank {len(want)} {list(want)}", subject=str(path))
        for j, (w, d) in enumerate(zip(want, have, strict=True)):
            if isinstance(d, int):
                if w != d:
                    raise UsageError(f"input {i} was exported with shape {shown} (dim {j} "
                                     f"static); re-export the model to tune shape {list(want)}",
                                     subject=str(path))
                continue
            vr = ep.range_constraints.get(d.node.expr)
            lo, hi = (vr.lower, vr.upper) if vr is not None else (0, float("inf"))
            if not lo <= w <= hi:
                raise UsageError(f"input {i} dim {j} is dynamic in [{lo}, {hi}] in the "
                                 f"export; --input-shape gives {w}", subject=str(path))


def _refuse_ops(problems: list[str], fmt: str, path: Path) -> None:
    if problems:
        raise UsageError(f"this {fmt} model runs more than torch's computing operators: "
                         f"{listed(problems)}", subject=str(path),
                         hint="pass --allow-pickle if you trust the file's code")


def _from_torchscript(torch: ModuleType, path: Path, args: tuple[Tensor, ...],
                      allow_pickle: bool) -> ExportedProgram:
    """A TorchScript file is a program: without `allow_pickle`, nothing in it may run as it
    loads (`code_payloads`) and its graphs may hold torch's computing operators only
    (farm/pipeline/operators.py), checked before the model first runs."""
    if not allow_pickle:
        refuse_code(path, "torchscript")
    try:
        ts = torch.jit.load(str(path), map_location="cpu").eval()
    except Exception as e:  # noqa: BLE001
        raise IngestError(f"torch.jit.load failed (truncated or corrupt?): {_first_line(e)}",
                          subject=str(path)) from e
    if not allow_pickle:
        _refuse_ops(torchscript_problems(torch, ts), "TorchScript", path)
    _check_runs(torch, ts, args, path)
    try:
        from torch._export.converter import TS2EPConverter

        ep = TS2EPConverter(ts, args).convert()
        # The converter marks dims dynamic and turns shape arithmetic into tensors;
        # re-exporting with the static inputs specializes them.
        return torch.export.export(ep.module(), args)
    except Exception as e:  # noqa: BLE001
        raise IngestError(f"torch cannot convert this TorchScript to torch.export: "
                          f"{_first_line(e)}", subject=str(path),
                          hint="export it yourself with torch.export.save and submit the .pt2") from e


def _from_pickle(torch: ModuleType, path: Path, args: tuple[Tensor, ...],
                 allow_pickle: bool) -> ExportedProgram:
    """A pickled nn.Module (loading it runs code from the file: only with --allow-pickle)."""
    if not allow_pickle:
        raise UsageError(PICKLE_REFUSED, subject=str(path), hint=PICKLE_HINT)
    try:
        model = torch.load(str(path), map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001
        raise IngestError(f"torch.load failed: {_first_line(e)}", subject=str(path),
                          hint="the classes the pickle names must be importable here") from e
    if not isinstance(model, torch.nn.Module):
        raise IngestError(f"the pickle holds a {type(model).__name__}, not an nn.Module "
                          f"(a state_dict has no architecture)", subject=str(path))
    model = model.eval()
    _check_runs(torch, model, args, path)
    try:
        return torch.export.export(model, args)
    except Exception as e:  # noqa: BLE001
        raise IngestError(f"torch.export cannot export this model: {_first_line(e)}",
                          subject=str(path)) from e


def _check_runs(torch: ModuleType, model: Module, args: tuple[Tensor, ...], path: Path) -> None:
    with torch.no_grad():
        try:
            model(*args)
        except Exception as e:  # noqa: BLE001
            shapes = [list(a.shape) for a in args]
            raise UsageError(f"the model does not run on inputs of shape {shapes} (wrong rank or "
                             f"size?): {_first_line(e)}", subject=str(path)) from e


def _to_relax(ep: ExportedProgram, path: Path) -> IRModule:
    """torch.export program -> Relax IRModule, weights bound as constants."""
    from tvm.relax.frontend.torch import from_exported_program

    try:
        return from_exported_program(ep)
    except Exception as e:  # noqa: BLE001 - name the operator the frontend lacks
        msg = str(e)
        ops = _unsupported_ops(msg)
        what = f"operator(s) {', '.join(ops)}" if ops else _first_line(e)
        raise ExtractError(f"TVM's torch frontend cannot convert {what}", subject=str(path),
                           hint="replace the operator in the model, or file it upstream") from e


def _unsupported_ops(msg: str) -> list[str]:
    import re

    m = re.search(r"Unsupported function type[s]?\s*\[?([^\]\n]*)\]?", msg)
    if not m:
        return []
    return [s.strip(" '\"") for s in m.group(1).split(",") if s.strip(" '\"")]


def export_module(model: object, example_inputs: tuple[object, ...] | None, path: Path) -> Path:
    """An nn.Module (a notebook's) saved as a torch.export program at `path`, the file a job
    reads: the module is traced with `example_inputs` here, nothing of it is pickled."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"a model is a .pt2/.pt path or an nn.Module, not a "
                         f"{type(model).__name__}", subject="model")
    if not example_inputs or not isinstance(example_inputs, tuple):
        raise UsageError("an nn.Module needs example_inputs: a tuple of tensors of the shapes "
                         "to tune for", subject=type(model).__name__,
                         hint="e.g. example_inputs=(torch.randn(1, 3, 224, 224),)")
    try:
        program = torch.export.export(model.eval(), example_inputs)
    except Exception as e:  # noqa: BLE001
        raise IngestError(f"torch.export cannot export this model: {_first_line(e)}",
                          subject=type(model).__name__) from e
    torch.export.save(program, str(path))
    return path
