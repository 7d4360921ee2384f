"""How well a round ranks the candidates of a workload the key's model never saw, after its
first batch: the key's model alone, the key's model corrected by the batch (what a round
does, workers/metaschedule/costmodel.py RankedModel), and a model of the batch alone. No tuning: it
reads the records of a farm home's store (e.g. bench/warm_model.py's filled home).

    python bench/ranking.py --home DIR [--first 16] [--min-records 48] [--out FILE]

For every workload of the store with at least --min-records valid records, leave it out:
train the key's model on all the others (as a round of a new workload finds it), take the
workload's first --first records in measuring order as the round's first batch, and rank
the rest with each model. Reported per workload and as means: the rank correlation of the
scores with the measured speed (random: ~0), and the mean run time of the quarter each
model ranks first over the mean of all (random: ~1; lower is better). The home is copied
first: training writes the key's model into the store.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rank_correlation(scores: np.ndarray, run_us: np.ndarray) -> float:
    """The held-out check's rank correlation (workers/metaschedule/heldout.py), of scores (higher:
    faster) with run times (lower: faster)."""
    from workers.metaschedule.heldout import rank_correlation as spearman

    return spearman(-np.asarray(scores), np.asarray(run_us))


def top_quarter(scores: np.ndarray, run_us: np.ndarray) -> float:
    top = np.argsort(-scores)[:max(1, len(scores) // 4)]
    return float(np.mean(run_us[top]) / np.mean(run_us))


def own_only(xs: list[np.ndarray], ys: np.ndarray, rest: list[np.ndarray]) -> np.ndarray:
    """MetaSchedule's XGBModel trained on the first batch alone (its warm-up bypassed)."""
    from tvm.s_tir.meta_schedule.cost_model import XGBModel

    model = XGBModel(num_tuning_cores=1, verbose_eval=0)
    model._train(xs=xs, ys=ys)  # noqa: SLF001
    return model._predict(xs=rest)  # noqa: SLF001


def features(store: Any, wk: str, recs: list[Any]) -> dict[str, np.ndarray]:
    from workers.metaschedule import samples

    cached = store.features(wk)
    missing = [r for r in recs if r.candidate not in cached]
    if missing:
        new = samples.featurize(store.get_workload(wk), missing)
        store.put_features(wk, new)
        cached.update(new)
    return {name: samples.decode(text) for name, text in cached.items() if text}


def evaluate(store: Any, mkey: str, wk: str, first: int) -> dict[str, Any] | None:
    from workers.metaschedule import costmodel

    recs = sorted(store.records(wk), key=lambda r: r.measured_at)
    feats = features(store, wk, recs)
    recs = [r for r in recs if r.candidate in feats]
    batch, rest = recs[:first], [r for r in recs[first:] if r.valid]
    if len(rest) < 16 or sum(r.valid for r in batch) < costmodel.CORRECTION_MIN:
        return None
    key = costmodel.train(store, mkey, exclude=(wk,))
    if key is None:
        return None
    costs = np.array([costmodel.cost_of(r) for r in batch], dtype=np.float32)
    xs, ys = [feats[r.candidate] for r in batch], (costs.min() / costs).astype(np.float32)
    rest_xs = [feats[r.candidate] for r in rest]
    run_us = np.array([r.run_us for r in rest], dtype=np.float64)
    rng = np.random.default_rng(len(rest))
    scores = {"random": rng.uniform(size=len(rest)), "key": key.predict(rest_xs),
              "key + batch": key.predict(rest_xs, key.fit_correction(xs, ys)),
              "batch alone": own_only(xs, ys, rest_xs)}
    row: dict[str, Any] = {"workload": store.get_workload(wk).name, "ranked": len(rest),
                           "key_trained_on": key.fields["trained_on"]}
    for name, s in scores.items():
        row[name] = (round(rank_correlation(np.asarray(s), run_us), 3),
                     round(top_quarter(np.asarray(s), run_us), 3))
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--home", required=True, help="a farm home no farm runs on")
    ap.add_argument("--first", type=int, default=16, help="records of the round's first batch")
    ap.add_argument("--min-records", type=int, default=48)
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    from farm.core.config import load_config
    from farm.local.embedded import embedded_store_url
    from farm.store import open_store
    from farm.store.learned import model_key

    work = Path(tempfile.mkdtemp(prefix="farm-ranking-"))
    home = work / "home"
    shutil.copytree(args.home, home)
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    try:
        with embedded_store_url(load_config(env={"FARM_HOME": str(home)})) as url:
            store = open_store(url)
            try:
                for wk in store.workload_keys():
                    task = store.get_workload(wk)
                    if task is None or sum(r.valid for r in store.records(wk)) < args.min_records:
                        continue
                    row = evaluate(store, model_key(task.device_key, task.target), wk, args.first)
                    if row is not None:
                        rows.append(row)
                        print(json.dumps(row), flush=True)
            finally:
                store.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = report(rows, args, time.monotonic() - t0)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


def report(rows: list[dict[str, Any]], args: argparse.Namespace, took_s: float) -> str:
    names = ["random", "key", "key + batch", "batch alone"]
    lines = [f"# Ranking a held-out workload after its first batch "
             f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, bench/ranking.py)", "",
             f"`python bench/ranking.py {' '.join(sys.argv[1:])}` ({took_s:.0f} s): each "
             f"workload with >= {args.min_records} valid records left out of the key's model; "
             f"its first {args.first} records are the batch; the rest ranked. Each cell: rank "
             "correlation with the measured speed (higher is better) / mean run time of the "
             "first-ranked quarter over the mean (lower is better).", "",
             "| workload | ranked | " + " | ".join(names) + " |",
             "|---|---|" + "---|" * len(names)]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['ranked']} | "
                     + " | ".join(f"{r[n][0]:.2f} / {r[n][1]:.2f}" for n in names) + " |")
    if rows:
        lines.append("| **all workloads (mean)** | | " + " | ".join(
            f"**{statistics.mean(r[n][0] for r in rows):.2f} / "
            f"{statistics.mean(r[n][1] for r in rows):.2f}**" for n in names) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
