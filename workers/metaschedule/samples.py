"""The samples a key's cost model learns from, and their features.

Samples are chosen by their **entries** (farm/store/packing.py: run time, failure class,
verified, TVM version: every measured candidate has one in Redis), so choosing reads no
whole record. Only the chosen samples whose features this host lacks are read whole, in one
go (Redis's hot records and one pass over the device key's archive: farm/store/cold.wholes),
featurized with MetaSchedule's per-store features and kept on the host
(farm/store/features.py). A key of a million records reads a few thousand entries' worth of
data per workload and parses only what it featurizes (bench/fleet.md).
"""

from __future__ import annotations

import base64
import logging
import zlib
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from tvm.s_tir.meta_schedule.database import Workload

from farm.core.messages import TuneTask
from farm.store import StoredRecord
from farm.store.cold import wholes
from farm.store.packing import feature_matrix
from farm.store.store import FAILED_RUN_SECS, Entry, ModelStore
from farm.tir.module import load_mod
from workers.metaschedule.database import tuning_record

log = logging.getLogger(__name__)

NEGATIVES = ("build", "runtime", "timeout", "wrong_answer", "culprit")  # failures it learns from
FEATURIZE_LIMIT = 2048  # records featurized per training: a big store is caught up over several

Measured = TypeVar("Measured", StoredRecord, Entry)  # a whole record, or its entry


def encode(x: np.ndarray) -> str:
    """A feature matrix (stores x features, float32) as text for the store."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    return f"{x.shape[0]}:{x.shape[1]}:" + base64.b64encode(zlib.compress(x.tobytes(), 9)).decode()


def decode(text: str) -> np.ndarray | None:
    """The feature matrix `encode` wrote; None for a candidate that has none."""
    return feature_matrix(text)


def cost_of(rec: StoredRecord | Entry) -> float:
    """What XGBModel learns from: the run time in seconds, a failure as 1e10 s."""
    return float(rec.run_us) * 1e-6 if rec.valid else FAILED_RUN_SECS  # type: ignore[arg-type]


def learnable(recs: list[Measured]) -> list[Measured]:
    """The records (or entries) of one workload a model learns from: the best first,
    failures last. Only what a phone of this farm measured with this TVM (not an import, not
    another version's timing) until a phone re-measures it."""
    from tvm import __version__ as tvm_version

    recs = [r for r in recs if r.trusted(tvm_version)
            and (r.valid or r.error_class in NEGATIVES)]
    recs.sort(key=lambda r: (not r.valid, r.run_us or 0.0))
    return recs


def featurize(task: TuneTask, recs: list[StoredRecord], threads: int = 1) -> dict[str, str]:
    """Each record's MetaSchedule per-store features, encoded ("" where it has none)."""
    import tvm
    from tvm.s_tir.meta_schedule import TuneContext
    from tvm.s_tir.meta_schedule.feature_extractor import PerStoreFeature

    workload = Workload(load_mod(task))
    context = TuneContext(mod=workload.mod, target=tvm.target.Target(task.target),
                          task_name="features", num_threads=threads)
    extractor = PerStoreFeature()
    out: dict[str, str] = {}
    cands, names = [], []
    for rec in recs:
        try:
            cands.append(tuning_record(rec, workload).as_measure_candidate())
            names.append(rec.candidate)
        except Exception as e:  # noqa: BLE001 - an unreadable record only costs its sample
            log.warning("workload %s: record %s has no features: %s", task.workload_key,
                        rec.candidate, e)
            out[rec.candidate] = ""
    try:
        feats = [x.numpy() for x in extractor.extract_from(context, cands)] if cands else []
    except Exception:  # noqa: BLE001 - one bad schedule: the others, one at a time
        feats = []
        for cand in cands:
            try:
                feats.append(extractor.extract_from(context, [cand])[0].numpy())
            except Exception:  # noqa: BLE001
                feats.append(np.zeros((0, 0), dtype=np.float32))
    for name, x in zip(names, feats, strict=True):
        out[name] = encode(x) if x.size else ""
    return out


@dataclass
class Picked:
    """A workload's samples for the key's model: its learnable entries (best first), those
    it learns from now (`chosen`), and the features it has."""

    learnable: int
    chosen: list[Entry]
    features: dict[str, str]


def pick(store: ModelStore, workloads: list[str], share: int,
         exclude: tuple[str, ...]) -> dict[str, Picked]:
    """Each workload's samples, chosen by their entries: no whole record is read here."""
    out = {}
    for wk in workloads:
        ents = learnable(store.entries(wk))
        chosen = ents[:share]
        if wk in exclude or len(chosen) < 2 or not chosen[0].valid:
            chosen = []
        out[wk] = Picked(len(ents), chosen, store.features(wk) if chosen else {})
    return out


def featurize_missing(store: ModelStore, picked: dict[str, Picked], device_key: str,
                      threads: int) -> None:
    """Features for the chosen samples that have none yet (at most FEATURIZE_LIMIT): their
    whole records read in one go, Redis's and the archive's, then kept on this host."""
    budget, wanted = FEATURIZE_LIMIT, {}
    for wk, p in picked.items():
        missing = [e for e in p.chosen if e.candidate not in p.features][:budget]
        if missing:
            wanted[wk] = missing
            budget -= len(missing)
    whole = wholes(store, store.archive, device_key, wanted) if wanted else {}
    for wk, found in whole.items():
        task = store.get_workload(wk)
        # a chosen sample whose whole record is nowhere this host reads (archive days past
        # their retention, another host's archive) has no features: said once, so that it is
        # not looked for again at every training
        new = {e.candidate: "" for e in wanted[wk] if e.candidate not in found}
        if task is not None and found:
            new.update(featurize(task, [found[e.candidate] for e in wanted[wk]
                                        if e.candidate in found], threads))
        store.put_features(wk, new)
        picked[wk].features.update(new)
