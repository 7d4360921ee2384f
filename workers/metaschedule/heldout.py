"""The key's cost model checked on workloads it did not learn from, per operator family.

The key's model (workers/metaschedule/costmodel.py) is two boosters, each trained on half of the
key's workloads (the half fixed by the workload key). Each workload is ranked by the booster
of the other half, as a new workload of its family would be: Spearman's rank correlation of
the predicted scores with the measured speeds of its records (failures included, as the
slowest). Averaged per operator family (farm/tir/family.py), this is the model's held-out
quality for that family; below MIN_HELDOUT_RHO it does not rank the family's new workloads.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import xgboost

# a key's model ranks a family's new workloads only where, trained without them, it ranked
# held-out workloads of that family with at least this mean rank correlation: the round's own
# model ranks at random before its warm-up (rank correlation 0; random scores over n
# workloads of ~32 records have a mean of sd ~0.18/sqrt(n))
MIN_HELDOUT_RHO = 0.2
# ... on at least this many held-out workloads of the family (one workload's correlation is
# too noisy a check: 0.68 on one layer norm, bench/learn.md)
MIN_HELDOUT_WORKLOADS = 2
HELDOUT_MIN_RECORDS = 8  # records of a held-out workload before its rank correlation counts


def rank_correlation(scores: np.ndarray, ys: np.ndarray) -> float:
    """Spearman's rank correlation of two score vectors (ties take their mean rank); 0 where
    either is constant."""
    def ranks(a: np.ndarray) -> np.ndarray:
        order = np.argsort(a, kind="mergesort")
        r = np.empty(len(a))
        r[order] = np.arange(len(a))
        _, inv = np.unique(a, return_inverse=True)
        return (np.bincount(inv, r) / np.bincount(inv))[inv]

    a, b = ranks(np.asarray(scores, dtype=float)), ranks(np.asarray(ys, dtype=float))
    if a.std() == 0 or b.std() == 0:
        return 0.0
    return float(np.corrcoef(a, b)[0, 1])


def folds(workloads: list[str]) -> dict[str, int]:
    """The half of a key's workloads each is in: alternating in the order of their keys'
    hashes, so the halves are as even as can be and a workload's half is fixed by the set."""
    order = sorted(workloads, key=lambda wk: hashlib.sha256(wk.encode()).hexdigest())
    return {wk: i % 2 for i, wk in enumerate(order)}


def heldout(boosters: list[xgboost.Booster], samples: dict[str, tuple[list[np.ndarray],
            np.ndarray]], fold: dict[str, int], families: dict[str, str]
            ) -> dict[str, list[float]]:
    """Each family's mean rank correlation on its workloads, each scored by the booster that
    did not learn from it (the other half's), with [mean, workloads]."""
    import xgboost as xgb

    per_family: dict[str, list[float]] = {}
    for wk, (xs, ys) in samples.items():
        fam = families.get(wk, "")
        if not fam or len(xs) < HELDOUT_MIN_RECORDS:
            continue
        other = boosters[1 - fold[wk]]
        ids = np.concatenate([[i] * len(x) for i, x in enumerate(xs)])
        pred = other.predict(xgb.DMatrix(np.concatenate(xs, axis=0)), output_margin=True)
        scores = np.bincount(ids.astype(np.int64), weights=pred, minlength=len(xs))
        per_family.setdefault(fam, []).append(rank_correlation(scores, ys))
    return {fam: [round(float(np.mean(r)), 3), len(r)] for fam, r in per_family.items()}
