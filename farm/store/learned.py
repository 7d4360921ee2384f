"""What the store keeps for the cost model of a device key (its "model key").

A model key is a device key and one target (`model_key`): the workloads tuned for
it share one XGBoost cost model, trained on all their records (workers/metaschedule/costmodel.py),
so a workload the farm never saw starts ranked by what every other one taught it.

Contract of every `LearnedStore` (tests/unit/test_store_*.py):

- `put_workload` indexes the workload under its model key (`model_workloads`),
  and under its operator family when the task knows it (`model_families`), also when
  the workload was stored before (so an old store's workloads join the first time a
  job submits them again); `remove_workload` takes it out of both.
- `features` are the cost model's per-record inputs, cached by candidate so a record
  is featurized once: opaque text, written by the trainer only; they go with their
  workload (`remove_workload`).
- `cost_model` is one mapping of text fields (the model and what it was trained on);
  `put_cost_model` replaces it whole, so a reader never sees half of two versions.
"""

from __future__ import annotations

import hashlib
from abc import abstractmethod
from typing import Protocol

from farm.core.aliases import JsonDict
from farm.core.profiles import canonical_target


def model_key(device_key: str, target: JsonDict) -> str:
    """The identity of the cost model workloads share: their device key and target."""
    text = f"{device_key}|{canonical_target(target)}"
    return f"{device_key}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


class LearnedStore(Protocol):
    @abstractmethod
    def model_workloads(self, mkey: str) -> list[str]:
        """The workload keys of a model key, sorted."""

    @abstractmethod
    def model_families(self, mkey: str) -> dict[str, str]:
        """Workload key -> its operator family, for the workloads of a model key whose
        family is known."""

    @abstractmethod
    def put_features(self, wk: str, features: dict[str, str]) -> None:
        """Cache the cost-model features of some candidates of a workload."""

    @abstractmethod
    def features(self, wk: str) -> dict[str, str]:
        """Candidate hash -> its cached features (those cached so far)."""

    @abstractmethod
    def put_cost_model(self, mkey: str, fields: dict[str, str]) -> None:
        """Replace the stored cost model of a model key (all its fields at once)."""

    @abstractmethod
    def cost_model(self, mkey: str) -> dict[str, str]:
        """The stored cost model of a model key; {} when none was trained yet."""
