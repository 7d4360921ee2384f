"""Stage 2, extract: Relax IRModule + device profile -> one TuneTask per fused TIR workload.

Inference batch norms are folded into the convolutions before them first (foldbn.py).

Fuse first (DecomposeOpsForInference, CanonicalizeBindings, the zero pipeline):
on the raw imported module MetaSchedule's extract_tasks silently finds 0 tasks.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from farm.core.aliases import IRModule, JsonDict, Target
from farm.core.errors import ExtractError
from farm.core.messages import TuneTask
from farm.core.profiles import DeviceProfile, canonical_target
from farm.devices.tvmapi import register_flop_estimator
from farm.pipeline.foldbn import fold_batch_norm
from farm.tir.blocknames import canonical_module
from farm.tir.family import family

if TYPE_CHECKING:
    from farm.pipeline.ingest import ModelBundle

log = logging.getLogger(__name__)


@dataclass
class Extracted:
    fused: IRModule  # the fused Relax module (compile applies the log to exactly this module)
    tasks: list[TuneTask]
    untunable: list[str]  # PrimFuncs of the fused module that are no tuning task


@dataclass
class Prepared:
    """A model ingested (torch) and split into tuning tasks (TVM) for one device profile."""

    bundle: ModelBundle
    extracted: Extracted
    profile: DeviceProfile


def workload_key(structural_hash: int, target: JsonDict, device_key: str) -> str:
    """Structural hash of the task's TIR + canonical target JSON + device key."""
    text = f"{structural_hash & 0xFFFFFFFFFFFFFFFF:016x}|{canonical_target(target)}|{device_key}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def fuse(mod: IRModule, target: Target) -> IRModule:
    import tvm
    from tvm import relax

    with target:
        seq = tvm.transform.Sequential([
            relax.transform.DecomposeOpsForInference(),
            relax.transform.CanonicalizeBindings(),
            # topk, sort, cumsum, sampling: to TIR (or a library) as tvm.compile does first;
            # LegalizeOps leaves them, and the VM cannot run them ("CodeGenVM cannot emit")
            *_dispatch_passes(target),
            relax.pipeline.zero_pipeline(),
        ])
        return seq(mod)


def _dispatch_passes(target: Target) -> list[Callable[[IRModule], IRModule]]:
    from tvm import relax

    try:
        return list(relax.pipeline.library_dispatch_passes(target))
    except ValueError:  # a target kind TVM has no dispatch for: its sort ops stay unbuildable
        return []


def extract(mod: IRModule, profile: DeviceProfile, model_name: str = "model",
            fold_bn: bool = True) -> Extracted:
    """Fuse the module for the profile's target (its inference batch norms folded into their
    convolutions unless `fold_bn` is False) and cut it into tuning tasks."""
    import tvm
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    target_json = profile.target_json()
    target = tvm.target.Target(target_json)
    try:
        fused = canonical_module(fuse(_folded(mod) if fold_bn else mod, target))
        extracted = ms.relax_integration.extract_tasks(fused, target)
    except Exception as e:  # noqa: BLE001 - TVM's error, named with its stage
        raise ExtractError(f"TVM cannot lower the model for {profile.key}: "
                           f"{str(e).strip().splitlines()[0] if str(e).strip() else e}",
                           subject=model_name) from e
    tasks = []
    for t in extracted:
        dispatched = t.dispatched[0]
        key = workload_key(tvm_ffi.structural_hash(dispatched), target_json, profile.key)
        tasks.append(TuneTask(
            name=str(t.task_name), workload_key=key, weight=int(t.weight),
            mod_json=tvm.ir.save_json(dispatched), target=target_json, device_key=profile.key,
            flop=float(_flop(dispatched)), family=family(dispatched),
        ))
    if not tasks:
        raise ExtractError("the model has no tunable operator (nothing to tune)",
                           subject=model_name, hint="check that the model computes something")
    # Several tasks can share one key (the same TIR under two names): tune it once.
    unique: dict[str, TuneTask] = {}
    for task in tasks:
        if task.workload_key in unique:
            prev = unique[task.workload_key]
            unique[task.workload_key] = replace(prev, weight=prev.weight + task.weight)
        else:
            unique[task.workload_key] = task
    task_names = {t.name for t in tasks}
    untunable = [gv.name_hint for gv, f in fused.functions.items()
                 if isinstance(f, tvm.tirx.PrimFunc) and gv.name_hint not in task_names]
    log.info("extract %s: %d tasks (%d unique workloads) for %s", model_name, len(tasks),
             len(unique), profile.key)
    return Extracted(fused=fused, tasks=list(unique.values()), untunable=untunable)


def _folded(mod: IRModule) -> IRModule:
    """The module with its batch norms folded (farm/pipeline/foldbn.py); as it is when the
    fold fails: an optimization never stops a job."""
    try:
        return fold_batch_norm(mod)
    except Exception as e:  # noqa: BLE001
        log.warning("batch norms not folded: %s", e)
        return mod


def _flop(mod: IRModule) -> float:
    # imported outside the try: a moved estimator is an error, not 0 FLOPs for every task
    from tvm.s_tir.analysis import estimate_tir_flops

    register_flop_estimator()

    try:
        return float(estimate_tir_flops(mod))
    except Exception as e:  # noqa: BLE001 - FLOPs are informational: this task's only
        log.warning("FLOPs of %s not estimated: %s", mod.get_global_vars()[0].name_hint
                    if len(mod.get_global_vars()) else "a task", e)
        return 0.0

