"""The key's cost model ranks a family's new workloads only where its held-out check earned it
(workers/metaschedule/heldout.py): trained on half of a key's workloads, it must rank the other half
better than random, per operator family. Synthetic features with a known law, so the verdict
is known: one family whose law holds in every workload, one whose two halves disagree."""

from __future__ import annotations

import numpy as np
import pytest

from farm.core.messages import TuneTask
from farm.store import StoredRecord, open_store
from farm.store.learned import model_key
from workers.metaschedule.samples import encode

TARGET = {"kind": "llvm"}
KEY = "k"
RECORDS = 40


def names_in_both_halves(per_half: int) -> dict[str, list[str]]:
    """Workload names of two families, `per_half` of each in each half of the key's
    workloads (the halves the key's model splits them into)."""
    from workers.metaschedule.heldout import folds

    i = 0
    while True:
        names = [f"{fam}{j}" for fam in ("steady", "split") for j in range(i, i + 2 * per_half)]
        fold = folds(names)
        if all(sum(fold[n] == f for n in names if n.startswith(fam)) == per_half
               for fam in ("steady", "split") for f in (0, 1)):
            return {fam: [n for n in names if n.startswith(fam)] for fam in ("steady", "split")}
        i += 1


NAMES = names_in_both_halves(3)


def fill(store, family: str, law) -> list[str]:
    """Three workloads of `family` in each half of the key, RECORDS measured candidates each,
    with cached features (so nothing is featurized) and run times given by `law(wk, x)`."""
    rng = np.random.default_rng(len(family))
    wks = NAMES[family]
    for wk in wks:
        store.put_workload(TuneTask(name=wk, workload_key=wk, weight=1, mod_json="{}",
                                    target=TARGET, device_key=KEY, family=family))
        feats = {}
        for i in range(RECORDS):
            x = rng.random((2, 8)).astype(np.float32)
            cand = f"{wk}-{i}"
            store.add_record(StoredRecord(workload_key=wk, candidate=cand, record=[{"i": i}],
                                          run_us=float(law(wk, x)), job_id="fill"))
            feats[cand] = encode(x)
        store.put_features(wk, feats)
    return wks


def steady(_wk, x):  # every workload: slower as feature 0 grows
    return 10.0 + 30.0 * x[:, 0].sum()


def split(wk, x):  # one half: slower as feature 1 grows; the other: faster
    from workers.metaschedule.heldout import folds

    s = x[:, 1].sum()
    return 10.0 + 30.0 * (s if folds(NAMES["steady"] + NAMES["split"])[wk] == 0 else 2.0 - s)


@pytest.fixture(scope="module")
def trained():
    from workers.metaschedule import costmodel

    store = open_store("memory://")
    fill(store, "steady", steady)
    fill(store, "split", split)
    model = costmodel.train(store, model_key(KEY, TARGET))
    assert model is not None
    return store, model


def test_a_family_whose_law_holds_is_ranked_and_one_whose_halves_disagree_is_not(trained):
    from workers.metaschedule.heldout import MIN_HELDOUT_RHO

    _, model = trained
    rho, n = model.heldout["steady"]
    # measured 0.37: the boosters learn both families at once, and the split family's law on
    # feature 1 is noise in the steady family's held-out ranking
    assert n == 6 and rho > MIN_HELDOUT_RHO, model.heldout
    rho, n = model.heldout["split"]
    assert n == 6 and rho < 0.0, model.heldout  # each half learned the other's opposite: -0.67
    assert model.ranks("steady")[0] and not model.ranks("split")[0]
    assert not model.ranks("never-seen")[0]  # no held-out workload: not checked, not used
    assert f"< {MIN_HELDOUT_RHO}" in model.ranks("split")[1]
    model.heldout["one"] = [0.9, 1]  # one held-out workload is too few to be a check
    assert not model.ranks("one")[0] and "not a check" in model.ranks("one")[1]
    del model.heldout["one"]


def test_a_round_ranks_with_the_key_model_only_for_a_family_it_earned(trained):
    """round_model: a new workload of the family the model ranks well is ranked by it; one of
    the family it ranks backwards, or of a family the key has no other workload of, starts as
    a fresh farm's would (its own untrained model: the first batch at random)."""
    import tvm
    from tvm.s_tir.meta_schedule.database import Workload

    from tests.unit.test_cache import matmul_mod
    from workers.metaschedule import costmodel

    store, _ = trained
    mod = matmul_mod(16)
    ranked = {}
    for family in ("steady", "split", "alone"):
        task = TuneTask(name=f"new-{family}", workload_key=f"new-{family}", weight=1,
                        mod_json=tvm.ir.save_json(mod), target=TARGET, device_key=KEY,
                        family=family)
        store.put_workload(task)
        model, learned, ranked_by = costmodel.round_model(store, task, Workload(mod),
                                                          tvm.target.Target(TARGET))
        ranked[family] = (type(model).__name__, learned, ranked_by)
    assert ranked["steady"][0] == "RankedModel" and "held-out" in ranked["steady"][2], ranked
    assert ranked["split"] == ("XGBModel", 0, ""), ranked
    assert ranked["alone"] == ("XGBModel", 0, ""), ranked
