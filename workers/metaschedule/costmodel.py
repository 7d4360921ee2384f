"""The cost models a round ranks candidates with: the workload's own, and its key's.

MetaSchedule's XGBModel predicts at random until it has seen 100 samples of the
workload it tunes. Two things keep a round of the farm from starting that blind:

- **The workload's own records** (`pretrained_cost_model`): every round trains its
  XGBModel on up to 512 stored records of the workload, valid and failed, so
  round k+1 starts where round k ended.
- **The key's model** (`KeyModel`): one XGBoost model per model key (device key +
  target, farm/store/learned.py) trained on the records of *every* workload of the
  key, all jobs, failures as negatives (TenSet-style: MetaSchedule's per-store
  features describe a schedule's loops and buffers, not its workload, and each
  workload's costs are normalized by its own best). It is kept in the store,
  versioned, and retrained by whichever round finds it stale (its key's records grew
  by a quarter since; one trainer at a time), not per round from scratch: each
  record's features are computed once and cached in the store. A round whose
  workload has fewer own records than XGBModel's warm-up ranks its candidates with
  the key's model until its own model has seen enough (`RankedModel`), and from its
  first samples on with the key's model *corrected* by them: a small booster fitted on
  the workload's own samples (stored, and every batch the round measured so far),
  boosting from the key's scores (`KeyModel.fit_correction`). The key's model alone
  would rank the whole round the same, whatever its phones measure.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from typing import TYPE_CHECKING

import numpy as np
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.cost_model import PyCostModel
from tvm.s_tir.meta_schedule.database import Workload

from farm.core import keys
from farm.core.aliases import MeasureCandidate, TuneContext
from farm.core.messages import TuneTask
from farm.devices.tvmapi import xgb_train, xgb_update
from farm.store.cold import wholes
from farm.store.learned import model_key
from farm.store.store import ArchivedRecords, ModelStore
from workers.metaschedule.database import tuning_record
from workers.metaschedule.features import CachedFeatures
from workers.metaschedule.heldout import MIN_HELDOUT_RHO, MIN_HELDOUT_WORKLOADS, folds, heldout
from workers.metaschedule.samples import cost_of, decode, featurize_missing, learnable, pick
from workers.metaschedule.transfer import families_of, relatives_in_store, task_family

if TYPE_CHECKING:
    import xgboost
    from tvm.s_tir.meta_schedule.cost_model import XGBModel
    from tvm.s_tir.meta_schedule.runner import RunnerResult

log = logging.getLogger(__name__)

PRETRAIN_LIMIT = 512  # stored records a round's own cost model learns from before it searches
MIN_SAMPLES = 64  # records of a key (of workloads with >= 2 each) before its model is trained
RETRAIN_GROWTH = 0.25  # the key's records grew by this fraction since its model: retrain
MIN_GROWTH = 32  # ... and by at least this many records
PER_WORKLOAD = 256  # records of one workload the key's model learns from (best first)
# records the key's model learns from in all: XGBModel's pack-sum training is Python-paced
# (bench/fleet.py: ~13 s for 3,000 samples on 2 cores), so a key of many workloads takes
# fewer of each, never fewer than MIN_PER_WORKLOAD
TRAIN_LIMIT = 4096
MIN_PER_WORKLOAD = 16

TRAIN_CLAIM_S = 120  # one trainer per key at a time, and a key retrained at most this often
CORRECTION_MIN = 8  # valid samples of a round's workload before they correct the key's ranking
CORRECTION_PARAMS = {"max_depth": 4, "min_child_weight": 1.0, "eta": 0.2}  # small, few samples
CORRECTION_ROUNDS = 40


class KeyModel:
    """A model key's cost model as the store keeps it: two XGBoost boosters, each trained on
    half of the key's workloads (split by workload), whose scores are averaged; each ranked
    the other half's workloads, so the model carries its own held-out check per operator
    family (`heldout`: family -> [mean rank correlation, workloads]) and ranks a family's new
    workload only where that check says it beats random (`ranks`)."""

    def __init__(self, mkey: str, fields: dict[str, str]) -> None:
        import xgboost as xgb

        self.mkey = mkey
        self.fields = fields
        self.boosters = [xgb.Booster(model_file=bytearray(base64.b64decode(fields[name])))
                         for name in ("booster", "booster2") if fields.get(name)]
        if not self.boosters:
            raise ValueError("the stored model has no booster")
        self.heldout: dict[str, list[float]] = json.loads(fields.get("heldout") or "{}")

    @property
    def version(self) -> int:
        return int(self.fields.get("version", 0))

    def describe(self) -> str:
        return (f"{self.mkey} v{self.version} ({self.fields.get('trained_on', '?')} records of "
                f"{self.fields.get('workloads', '?')} workloads)")

    def ranks(self, family: str) -> tuple[bool, str]:
        """Whether this model ranks a new workload of `family`, and why (for the round's log)."""
        if family not in self.heldout:
            return False, f"no held-out workload of its family ({family}) to check it on"
        rho, n = self.heldout[family]
        if n < MIN_HELDOUT_WORKLOADS:
            return False, (f"rank correlation {rho:.2f} on {int(n)} held-out workload of its "
                           f"family (fewer than {MIN_HELDOUT_WORKLOADS}: not a check)")
        verdict = rho >= MIN_HELDOUT_RHO
        return verdict, (f"rank correlation {rho:.2f} on {int(n)} held-out workloads of its "
                         f"family ({'>=' if verdict else '<'} {MIN_HELDOUT_RHO})")

    def margin(self, data: xgboost.DMatrix) -> np.ndarray:
        """The boosters' mean per-store score of each row of `data`."""
        return np.mean([b.predict(data, output_margin=True) for b in self.boosters], axis=0)

    def predict(self, xs: list[np.ndarray],
                correction: xgboost.Booster | None = None) -> np.ndarray:
        """A score per candidate (higher: faster) from each candidate's feature matrix; with
        `correction` (a booster `fit_correction` made), the key's scores as corrected by it."""
        import xgboost as xgb

        scores = np.zeros(len(xs))
        rows = [x for x in xs if x is not None and len(x)]
        if not rows:
            return scores
        ids = np.concatenate([[i] * len(x) for i, x in enumerate(xs) if x is not None and len(x)])
        data = xgb.DMatrix(np.concatenate(rows, axis=0))
        pred = self.margin(data)
        if correction is not None:
            data.set_base_margin(pred)  # the correction boosts on from the key's scores
            pred = correction.predict(data, output_margin=True)
        return np.bincount(ids.astype(np.int64), weights=pred, minlength=len(xs))

    def fit_correction(self, xs: list[np.ndarray], ys: np.ndarray,
                       threads: int = 1) -> xgboost.Booster | None:
        """A booster that corrects this model's scores for one workload from its own samples
        (feature matrices, scores min cost / cost): trained by MetaSchedule's pack-sum loss,
        starting from this model's per-store scores instead of from zero (boosting from a
        prior). A few samples move the key's ranking where they disagree with it and leave
        it elsewhere; None while there are too few valid samples to learn from."""
        import xgboost as xgb
        from tvm.s_tir.meta_schedule.cost_model.xgb_model import PackSum, XGBConfig

        keep = [i for i, x in enumerate(xs) if x is not None and len(x)]
        if sum(1 for i in keep if ys[i] > 1e-6) < CORRECTION_MIN:  # failures score ~1e-15
            return None
        data = PackSum(xs=[xs[i] for i in keep], ys=ys[keep])
        data.dmatrix.set_base_margin(self.margin(data.dmatrix))
        params = XGBConfig(nthread=threads).to_dict() | CORRECTION_PARAMS
        return xgb.train(params, data.dmatrix, num_boost_round=CORRECTION_ROUNDS,
                         obj=lambda pred, _data: data.obj_square_error(pred))


def per_workload(workloads: int) -> int:
    """Records of each workload the key's model learns from, for a key of `workloads`."""
    return max(MIN_PER_WORKLOAD, min(PER_WORKLOAD, TRAIN_LIMIT // max(1, workloads)))


def key_records(store: ModelStore, mkey: str) -> int:
    return sum(store.record_count(wk) for wk in store.model_workloads(mkey))


def _fit(xs: list[np.ndarray], ys: np.ndarray, threads: int) -> xgboost.Booster:
    from tvm.s_tir.meta_schedule.cost_model import XGBModel

    model = XGBModel(num_tuning_cores=threads, verbose_eval=0)
    np.random.seed(len(xs))
    xgb_train(model, xs, ys)  # XGBModel's own pack-sum training (a private TVM use)
    return model.booster


def train(store: ModelStore, mkey: str, threads: int = 1,
          exclude: tuple[str, ...] = ()) -> KeyModel | None:
    """Train the key's model on every workload of the key (but `exclude`) and store it: two
    boosters, one per half of the workloads, and each half's held-out rank correlation per
    family as scored by the other half's booster. A key of one workload with samples, or with
    too few samples in either half, gets no model: its quality could not be checked."""
    t0 = time.monotonic()
    workloads = store.model_workloads(mkey)
    first = store.get_workload(workloads[0]) if workloads else None
    picked = pick(store, workloads, per_workload(len(workloads)), exclude)
    featurize_missing(store, picked, first.device_key if first else "", threads)
    samples: dict[str, tuple[list[np.ndarray], np.ndarray]] = {}
    for wk, p in picked.items():
        decoded = [(decode(p.features[e.candidate]), cost_of(e)) for e in p.chosen
                   if p.features.get(e.candidate)]
        pairs = [(x, c) for x, c in decoded if x is not None and len(x)]
        if len(pairs) < 2:
            continue
        costs = np.array([c for _, c in pairs], dtype=np.float32)
        samples[wk] = ([x for x, _ in pairs], costs.min() / costs)
    fold = folds(list(samples))
    halves = [[wk for wk in samples if fold[wk] == f] for f in (0, 1)]
    sizes = [sum(len(samples[wk][0]) for wk in half) for half in halves]
    if min(sizes) < MIN_SAMPLES // 2:
        return None
    boosters = [_fit([x for wk in half for x in samples[wk][0]],
                     np.concatenate([samples[wk][1] for wk in half]), threads) for half in halves]
    checked = heldout(boosters, samples, fold, families_of(store, mkey))
    previous = store.cost_model(mkey)
    fields = {
        "booster": base64.b64encode(bytes(boosters[0].save_raw())).decode(),
        "booster2": base64.b64encode(bytes(boosters[1].save_raw())).decode(),
        "heldout": json.dumps(checked, sort_keys=True),
        "version": str(int(previous.get("version", 0)) + 1),
        "samples": str(sum(p.learnable for p in picked.values())),
        "trained_on": str(sum(sizes)), "workloads": str(len(samples)),
        "trained_at": str(time.time()),
        "train_s": f"{time.monotonic() - t0:.1f}", "excluded": ",".join(exclude),
    }
    store.put_cost_model(mkey, fields)
    log.info("cost model %s: trained on %d records of %d workloads in %.1f s; held out, per "
             "family: %s", mkey, sum(sizes), len(samples), time.monotonic() - t0,
             "; ".join(f"{fam} {r:.2f} ({int(n)})" for fam, (r, n) in sorted(checked.items()))
             or "none")
    return KeyModel(mkey, fields)


def stale(store: ModelStore, mkey: str, fields: dict[str, str]) -> bool:
    """The key's records grew enough since its model (or its model has no held-out check:
    one an older farm trained)."""
    current = key_records(store, mkey)
    if fields.get("booster") and "heldout" not in fields:
        return current >= MIN_SAMPLES
    trained = int(fields.get("samples", 0)) if fields else 0
    return current >= MIN_SAMPLES and current - trained >= max(MIN_GROWTH, RETRAIN_GROWTH * trained)


# keys whose stale model this process's rounds ranked with: retrained after the round
# (`train_pending`), not before it. Training takes seconds to tens of seconds (19 s for 1,120
# records of 35 workloads on 2 cores, bench/learn.md): in a round's set-up it held up the
# first round of every job that came after a job that grew the store, most of a small job's
# wall. A model that knows most of the store ranks as well meanwhile.
_PENDING: set[str] = set()


def far_behind(store: ModelStore, mkey: str, fields: dict[str, str]) -> bool:
    """The key's records at least doubled since its model learned: retrained before a round
    ranks with it, not after. A retraining left for after a round can be lost (the embedded
    farm stops with its job, a worker gives a task 10 s to end): this bounds how far behind
    the store a model ranks however often that happens."""
    return key_records(store, mkey) >= 2 * int(fields.get("samples", 0) or 0)


def key_model(store: ModelStore, task: TuneTask, threads: int = 1) -> KeyModel | None:
    """The key's model for a round of `task`; None when the key has too few records for one.
    A stale one is used as it is and retrained after the round (`train_pending`); with none
    yet, or one far behind the store, the round trains it first (unless another round is
    training it)."""
    mkey = model_key(task.device_key, task.target)
    fields = store.cost_model(mkey)
    if stale(store, mkey, fields):
        if fields.get("booster") and not far_behind(store, mkey, fields):
            _PENDING.add(mkey)
        elif store.claim(keys.model_training(mkey), TRAIN_CLAIM_S):
            model = train(store, mkey, threads)
            if model is not None:
                return model
    if not fields.get("booster"):
        return None
    try:
        return KeyModel(mkey, fields)
    except Exception as e:  # noqa: BLE001 - a bad model only costs the warm start
        log.warning("cost model %s unreadable, not used: %s", mkey, e)
        return None


def train_pending(store: ModelStore, threads: int = 1) -> list[str]:
    """After a round: retrain the stale key models this process's rounds ranked with, each
    unless another round is training it or it is fresh by now; the keys trained."""
    done = []
    while _PENDING:
        mkey = _PENDING.pop()
        try:
            if stale(store, mkey, store.cost_model(mkey)) and \
                    store.claim(keys.model_training(mkey), TRAIN_CLAIM_S) and \
                    train(store, mkey, threads) is not None:
                done.append(mkey)
        except Exception as e:  # noqa: BLE001 - the round is done; the next one ranks with
            log.warning("cost model %s: retraining failed: %s", mkey, e)  # the model it has
    return done


def learn(model: object, context: TuneContext, candidates: list[MeasureCandidate],
          results: list[RunnerResult]) -> None:
    """A cost model learns a measured batch (MetaSchedule's `update`). An XGBModel that is
    still in its warm-up after it (fewer samples than `num_warmup_samples`: it predicts at
    random, whatever its booster) keeps the samples and skips the retraining that its
    `update` does every batch: nothing reads that booster before the warm-up ends, and the
    training once it ends learns from every sample. A round's own model spends no CPU on
    boosters it never ranks with (most rounds of a job at 16-64 trials a task)."""
    if hasattr(model, "num_warmup_samples") and hasattr(model, "data_size"):
        xgb_update(model, context, candidates, results,
                   train=model.data_size + len(candidates) >= model.num_warmup_samples)
    else:
        model.update(context, candidates, results)  # type: ignore[attr-defined]


@derived_object
class RankedModel(PyCostModel):
    """The round's own XGBModel, ranking with the key's model until its own has warmed up:
    the key's scores corrected by the workload's own samples (stored and of this round's
    batches so far), refitted after every batch, so the round's ranking learns from what its
    phones measure instead of staying the key's for the whole round. It is refitted when the
    round ranks next, not as a batch's results come: a round's last batch ranks nothing."""

    def __init__(self, own: XGBModel, key: KeyModel, threads: int = 1) -> None:
        super().__init__()
        self.own = own
        self.key = key
        self.threads = threads
        self.correction: xgboost.Booster | None = None
        self.corrected_on = 0  # own samples the correction learned from
        self.stale = True  # samples came since the correction was fitted: refit before ranking

    def load(self, path: str) -> None:
        self.own.load(path)
        self.stale = True

    def save(self, path: str) -> None:
        self.own.save(path)

    def warm(self) -> bool:
        return self.own.data_size >= self.own.num_warmup_samples and self.own.booster is not None

    def update(self, context: TuneContext, candidates: list[MeasureCandidate],
               results: list[RunnerResult]) -> None:
        learn(self.own, context, candidates, results)
        self.stale = True

    def _refit(self) -> None:
        self.stale = False
        groups = list(self.own.data.values())
        if self.warm() or not groups:
            self.correction, self.corrected_on = None, 0
            return
        xs = [x for g in groups for x in g.features]
        with np.errstate(divide="ignore", invalid="ignore"):
            ys = np.concatenate([np.divide(g.min_cost, g.costs, out=np.zeros_like(g.costs),
                                           where=g.costs != 0) for g in groups])
        try:
            self.correction = self.key.fit_correction(xs, ys.astype(np.float32), self.threads)
        except Exception as e:  # noqa: BLE001 - the key's ranking alone is still a ranking
            log.warning("the key's ranking could not be corrected by the round's samples: %s", e)
            self.correction = None
        self.corrected_on = len(xs) if self.correction is not None else 0

    def predict(self, context: TuneContext, candidates: list[MeasureCandidate]) -> np.ndarray:
        if self.warm():
            return self.own.predict(context, candidates)
        if self.stale:
            self._refit()
        xs = [x.numpy().astype("float32") for x in self.own.extractor.extract_from(context, candidates)]
        return self.key.predict(xs, self.correction)


def pretrained_cost_model(store: ArchivedRecords, workload_key: str, workload: Workload,
                          target: object, threads: int = 1) -> tuple[XGBModel, int]:
    """An XGBoost cost model already trained on the workload's stored records (valid and
    failed), so that round k+1 is not a cold start. Returns (model, records learned from).

    A fresh XGBModel per round would never leave its random warm-up (100 samples) with
    rounds of 32 trials; with this, it does from the fourth round on (or at once, for a
    workload tuned before by any job)."""
    from tvm.s_tir.meta_schedule import TuneContext
    from tvm.s_tir.meta_schedule.cost_model import XGBModel
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    model = XGBModel(num_tuning_cores=threads, extractor=CachedFeatures())
    candidates, results = [], []
    chosen = learnable(store.entries(workload_key))[:PRETRAIN_LIMIT]  # picked by entries
    task = store.get_workload(workload_key) if chosen else None
    found = wholes(store, store.archive, task.device_key if task else "",
                   {workload_key: chosen})[workload_key] if chosen else {}
    for rec in (found[e.candidate] for e in chosen if e.candidate in found):
        try:
            cand = tuning_record(rec, workload).as_measure_candidate()
        except Exception as e:  # noqa: BLE001 - an unreadable record only costs its sample
            log.warning("workload %s: record %s not usable for the cost model: %s",
                        workload_key, rec.candidate, e)
            continue
        secs = [cost_of(rec)] if rec.valid else None
        candidates.append(cand)
        results.append(RunnerResult(run_secs=secs, error_msg=None if secs else "failed"))
    if candidates:
        np.random.seed(len(candidates))  # XGBoost's training is seeded, keep ours too
        context = TuneContext(mod=workload.mod, target=target, task_name="pretrain")
        learn(model, context, candidates, results)
    return model, len(candidates)


def round_model(store: ModelStore, task: TuneTask, workload: Workload, target: object,
                threads: int = 1) -> tuple[XGBModel | RankedModel, int, str]:
    """The cost model of a round: (model, own records it learned from, what ranks first).

    The key's model ranks a workload that has not warmed up its own model only where it
    has earned it: the key holds other workloads of the workload's operator family
    (workers/metaschedule/transfer.py) and, trained without them, it ranked them better than
    random (`KeyModel.ranks`). Elsewhere the round ranks as a fresh farm would (its first
    batch at random), so a store of unrelated models costs a new one nothing: no training,
    no ranking by a model of other operators."""
    own, learned = pretrained_cost_model(store, task.workload_key, workload, target, threads)
    if learned >= own.num_warmup_samples:
        return own, learned, "own records"
    fallback = "own records" if learned else ""
    family = task_family(task)
    if not relatives_in_store(store, task, family):
        return own, learned, fallback
    try:
        key = key_model(store, task, threads)
    except Exception as e:  # noqa: BLE001 - the key's model is a head start, never a must
        log.warning("workload %s: the key's cost model is not available: %s",
                    task.workload_key, e)
        key = None
    if key is None:
        return own, learned, fallback
    ranks, why = key.ranks(family)
    if not ranks:
        log.info("workload %s: the key's model %s does not rank it: %s", task.workload_key,
                 key.describe(), why)
        return own, learned, fallback
    return RankedModel(own, key, threads), learned, f"key model {key.describe()}: {why}"
