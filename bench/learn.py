"""Does the store learn? Held-out models tuned on a store of other models (warm), on a store
of unrelated ones only, and on a fresh one (cold), against plain MetaSchedule, every tuned
model timed side by side in fresh processes.

    python bench/learn.py [--unrelated transformer] [--fill resnet,mobilenet,bottleneck]
                          [--held-out squeeze,hybrid] [--fill-trials 32] [--trials 4,16]
                          [--runs 1] [--plain 64] [--plain-models squeeze]
                          [--set FARM_NAME=VALUE ...] [--no-cold]
                          [--out bench/learn.md] [--work DIR [--reuse]]

1. The zoo (bench/zoo.py: random weights, nothing downloaded) is written to the work folder.
2. One farm home (the embedded default: its Redis, tracker, 2 emulated runtime-only phones)
   tunes the --unrelated models, and a copy of it is kept (the "unrelated" store); then it
   tunes the --fill models too (the "warm" store), --fill-trials per task.
3. Each held-out model, at each --trials budget: on a fresh home (cold), on a copy of the
   warm store (warm), on a copy of the unrelated store (unrelated); the order of the sides
   rotates from one job to the next. The held-out models are in neither store: leave them
   out, as a new user's model is. `--runs N`: each job N times (a fresh copy each time): a
   single run's tuned latency at these budgets varies up to ~1.4x between identical runs.
   `--reuse`: the stores an earlier run left in --work are used as they are (no fill).
4. Plain MetaSchedule (bench/plain.py: TVM's own RPC server as phones, `ms.tune_tasks`) on
   the --plain-models at --plain trials per task. A plain run that measured nothing valid
   is an error, not a baseline.
5. Per held-out model, every log timed in fresh processes, 3 rounds in rotating order
   (bench/latency.py), medians; untuned and torch beside them.

Writes <out> (markdown) and <out>.json; prints every run as it ends.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from latency import latencies  # bench/: this script's folder
from run import ROOT, farm_submit, plain_metaschedule, threads_env

from farm.store.learned import model_key

TRANSFER = re.compile(r"transfer: (\d+) of (\d+) relatives' best schedules applied")


def transfer_counts(home: Path) -> tuple[int, int]:
    """(relatives whose best schedule applied, relatives tried) over a home's worker logs."""
    applied = tried = 0
    for path in (home / "logs").rglob("*.log"):
        for m in TRANSFER.finditer(path.read_text(errors="replace")):
            applied, tried = applied + int(m.group(1)), tried + int(m.group(2))
    return applied, tried


def cpu_parts(cpu: dict[str, Any]) -> dict[str, float]:
    """A job's host CPU seconds per part of its rounds (summary.json's "cpu"), phone hosts'
    and helpers' together."""
    parts: dict[str, float] = {}
    for side in ("phone_hosts_s", "helpers_s"):
        for part, s in (cpu.get(side) or {}).items():
            parts[part] = round(parts.get(part, 0.0) + s, 2)
    return parts


def cpu_table(models: dict[str, Any]) -> list[str]:
    """Per held-out model, budget and side: the mean over its runs of each part's CPU s."""
    rows = [r | {"model": name} for name, m in models.items() for r in m["rows"]
            if r.get("cpu_parts_s")]
    parts = sorted({p for r in rows for p in r["cpu_parts_s"]})
    lines = ["| model | trials/task | side | runs | " + " | ".join(parts) + " | sum |",
             "|---|---|---|---|" + "---|" * (len(parts) + 1)]
    for key in sorted({(r["model"], r["trials"], r["side"]) for r in rows}):
        runs = [r for r in rows if (r["model"], r["trials"], r["side"]) == key]
        mean = {p: sum(r["cpu_parts_s"].get(p, 0.0) for r in runs) / len(runs) for p in parts}
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {len(runs)} | "
                     + " | ".join(f"{mean[p]:.1f}" for p in parts)
                     + f" | {sum(mean.values()):.1f} |")
    return lines


def job(model: Path, trials: int, side: str, home: Path, out: Path, work: Path,
        settings: dict[str, str] | None = None) -> dict[str, Any]:
    t0 = time.monotonic()
    before = transfer_counts(home) if home.exists() else (0, 0)
    run = farm_submit(model, trials, out, home, env={**threads_env(1, work), **(settings or {})})
    after = transfer_counts(home)
    tasks = run["summary"]["tasks"]
    cpu = run["summary"].get("cpu") or {}
    row = {"model": model.stem, "trials": trials, "side": side, "wall_s": round(run["wall_s"], 1),
           "tuning_s": round(run["tuning_s"], 1), "measured": run["trials"],
           "from_store": sum(t["trials_from_store"] for t in tasks),
           "transfer_applied": after[0] - before[0], "transfer_tried": after[1] - before[1],
           "log": run["log"], "job_id": run["summary"]["job_id"],
           "cpu_s": cpu.get("total_s"), "cpu_parts_s": cpu_parts(cpu)}
    print(json.dumps({**row, "elapsed_s": round(time.monotonic() - t0)}), flush=True)
    return row


def held_out(model: Path, budgets: list[int], stores: dict[str, Path], work: Path,
             turn: int, runs: int = 1, settings: dict[str, str] | None = None,
             cold: bool = True) -> list[dict[str, Any]]:
    rows = []
    for run in range(runs):
        for trials in budgets:
            sides = ["cold", *stores] if cold else list(stores)
            k = turn % len(sides)
            turn += 1
            for side in sides[k:] + sides[:k]:
                name = f"{side}-{model.stem}-{trials}-{run}"
                home = work / f"home-{name}"
                shutil.rmtree(home, ignore_errors=True)
                if side != "cold":
                    shutil.copytree(stores[side], home, ignore=shutil.ignore_patterns("logs"))
                shutil.rmtree(work / f"out-{name}", ignore_errors=True)
                rows.append({**job(model, trials, side, home, work / f"out-{name}", work,
                                   settings), "run": run})
    return rows


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def heldout_table(home: Path) -> list[str]:
    """The key's cost model of a farm home's store (after its fill): per operator family, its
    held-out rank correlation (workers/metaschedule/heldout.py) and whether it ranks that family's
    new workloads."""
    from farm.core.config import load_config
    from farm.local.embedded import embedded_store_url
    from farm.store import open_store
    from workers.metaschedule.heldout import MIN_HELDOUT_RHO, MIN_HELDOUT_WORKLOADS

    lines = ["| model key | version | trained on | family | held-out rank correlation | "
             "held-out workloads | ranks new ones |", "|---|---|---|---|---|---|---|"]
    with embedded_store_url(load_config(env={"FARM_HOME": str(home)})) as url:
        store = open_store(url)
        try:
            mkeys = {key for wk in store.workload_keys()
                     if (t := store.get_workload(wk)) is not None
                     for key in [model_key(t.device_key, t.target)]}
            for mkey in sorted(mkeys):
                fields = store.cost_model(mkey)
                for fam, (rho, n) in sorted(json.loads(fields.get("heldout") or "{}").items()):
                    cell = fam.replace("|", "\\|")  # a table cell
                    ranks = rho >= MIN_HELDOUT_RHO and n >= MIN_HELDOUT_WORKLOADS
                    lines.append(f"| {mkey} | v{fields.get('version')} | "
                                 f"{fields.get('trained_on')} records of "
                                 f"{fields.get('workloads')} workloads | `{cell}` | {rho:.2f} | "
                                 f"{int(n)} | {'yes' if ranks else 'no'} |")
        finally:
            store.close()
    return lines


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def verdicts(name: str, rows: list[dict[str, Any]], plain: dict[str, Any] | None,
             untuned: float) -> list[str]:
    """The issue's targets for one held-out model, each with its numbers."""
    # over several runs a side: their medians
    cells = {(r["side"], r["trials"]) for r in rows}
    us = {c: median([r["tuned_us"] for r in rows if (r["side"], r["trials"]) == c]) for c in cells}
    wall = {c: median([r["wall_s"] for r in rows if (r["side"], r["trials"]) == c]) for c in cells}
    out = []
    for trials in sorted({r["trials"] for r in rows}):
        for side in sorted({r["side"] for r in rows} - {"cold"}):
            w, c = us.get((side, trials)), us.get(("cold", trials))
            if w and c:
                out.append(f"{name}, {trials} trials, {side} vs cold: tuned {w:.1f} / {c:.1f} us = "
                           f"{w / c:.2f} ({'met' if w <= c else 'NOT met'}: <= 1); wall "
                           f"{wall[(side, trials)]:.0f} / {wall[('cold', trials)]:.0f} s = "
                           f"{wall[(side, trials)] / wall[('cold', trials)]:.2f} (target <= 1.05)")
    if plain:
        p = plain["tuned_us"]
        for side in ("warm", "cold"):
            if (side, 4) in us and untuned > p:
                share = (untuned - us[(side, 4)]) / (untuned - p)
                out.append(f"{name}, transfer at 4 trials ({side}): {share:.0%} of plain's "
                           f"speed-up at {plain['trials']} (target >= 50 %)")
            if (side, 16) in us:
                out.append(f"{name}, few-shot 16 trials ({side}): {us[(side, 16)]:.1f} us vs "
                           f"plain at {plain['trials']} {p:.1f} us = {us[(side, 16)] / p:.2f} "
                           "(target <= 1)")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--unrelated", default="transformer")
    ap.add_argument("--fill", default="resnet,mobilenet,bottleneck")
    ap.add_argument("--held-out", default="squeeze,hybrid")
    ap.add_argument("--fill-trials", type=int, default=32)
    ap.add_argument("--trials", default="4,16")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--reuse", action="store_true",
                    help="use the stores an earlier run left in --work (no fill)")
    ap.add_argument("--plain", type=int, default=64)
    ap.add_argument("--plain-models", default="squeeze")
    ap.add_argument("--out", default=str(Path(__file__).with_name("learn.md")))
    ap.add_argument("--work", default="")
    ap.add_argument("--set", action="append", default=[], metavar="FARM_NAME=VALUE",
                    help="a setting of every held-out job (not the fill's), e.g. "
                         "FARM_SEARCH_POOL=0; repeatable")
    ap.add_argument("--no-cold", action="store_true",
                    help="no fresh-store side (a side by side of settings on the warm store)")
    ap.add_argument("--heldout-of", default="",
                    help="only print the key's cost model's held-out check of this farm home")
    args = ap.parse_args()
    if args.heldout_of:
        print("\n".join(heldout_table(Path(args.heldout_of))))
        return 0
    work = Path(args.work or tempfile.mkdtemp(prefix="farm-learn-"))
    work.mkdir(parents=True, exist_ok=True)
    names = [n for group in (args.unrelated, args.fill, args.held_out) for n in group.split(",")
             if n]
    subprocess.run([sys.executable, str(ROOT / "bench" / "zoo.py"), str(work), *names],
                   check=True, capture_output=True)
    t0 = time.monotonic()
    home = work / "home-fill"
    fills: list[dict[str, Any]] = []
    for name in filter(None, args.unrelated.split(",") if not args.reuse else []):
        fills.append(job(work / f"{name}.pt2", args.fill_trials, "fill", home,
                         work / f"fill-{name}", work))
    stores = {}
    if args.unrelated:
        stores["unrelated"] = work / "store-unrelated"
        if not args.reuse:
            shutil.copytree(home, stores["unrelated"], ignore=shutil.ignore_patterns("logs"))
    for name in filter(None, args.fill.split(",") if not args.reuse else []):
        fills.append(job(work / f"{name}.pt2", args.fill_trials, "fill", home,
                         work / f"fill-{name}", work))
    stores = {"warm": home, **stores}
    fill_s = time.monotonic() - t0
    checked = heldout_table(home)
    print("\n".join(checked), flush=True)
    budgets = [int(t) for t in args.trials.split(",")]
    results: dict[str, Any] = {"args": vars(args), "fill": fills, "fill_s": round(fill_s),
                               "heldout": checked, "models": {}}
    for turn, name in enumerate(filter(None, args.held_out.split(","))):
        model = work / f"{name}.pt2"
        rows = held_out(model, budgets, stores, work, turn, args.runs,
                        dict(kv.split("=", 1) for kv in args.set), cold=not args.no_cold)
        plain = None
        if name in args.plain_models.split(","):
            p = plain_metaschedule(model, args.plain, work / f"plain-{name}")
            plain = {"trials": args.plain, "wall_s": round(p["process_wall_s"], 1),
                     "valid": p["valid"], "measured": p["trials"], "log": p["db"]}
            print(json.dumps({"model": name, "side": "plain", **plain}), flush=True)
        logs = [r["log"] for r in rows] + ([plain["log"]] if plain else [])
        lat = latencies(model, 1, logs, rounds=3)
        for r, us in zip(rows, lat["tuned_us"], strict=False):
            r["tuned_us"] = round(us, 1)
            r["runs_us"] = [round(x["tuned_us"][logs.index(r["log"])], 1) for x in lat["rounds"]]
        if plain:
            plain["tuned_us"] = round(lat["tuned_us"][-1], 1)
            plain["runs_us"] = [round(x["tuned_us"][-1], 1) for x in lat["rounds"]]
        results["models"][name] = {
            "rows": rows, "plain": plain, "untuned_us": round(lat["untuned_us"], 1),
            "torch_us": round(lat["torch_us"], 1),
            "verdicts": verdicts(name, rows, plain, lat["untuned_us"])}
        print(json.dumps({name: results["models"][name]["verdicts"]}), flush=True)
    Path(args.out).with_suffix(".json").write_text(json.dumps(results, indent=1))
    Path(args.out).write_text(report(results))
    print(report(results))
    return 0


def report(results: dict[str, Any]) -> str:
    a = results["args"]
    lines = [f"# Does the store learn? ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             "bench/learn.py)", "",
             f"`python bench/learn.py {' '.join(sys.argv[1:])}`. Stores: unrelated = "
             f"{a['unrelated']}; warm = unrelated + {a['fill']}; {a['fill_trials']} trials a "
             f"task ({'filled by an earlier run, reused' if a.get('reuse') else str(results['fill_s']) + ' s'}). Held out (in no store): {a['held_out']}. "
             f"{a.get('runs', 1)} run(s) a side (each its own job on a fresh copy of its store; "
             "the targets below compare the runs' medians); each tuned model timed 3 times "
             "in fresh processes, rotating order: the median and every timing are shown.", "",
             "| model | trials/task | side | run | tuned us (median; timings) | vs cold | "
             "job wall s | vs cold | measured | from store | transfer applied / tried |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in results["models"].items():
        cold = {(r["trials"], r.get("run", 0)): r for r in m["rows"] if r["side"] == "cold"}
        for r in sorted(m["rows"], key=lambda r: (r["trials"], r["side"], r.get("run", 0))):
            c = cold.get((r["trials"], r.get("run", 0)), {})
            lines.append(
                f"| {name} | {r['trials']} | {r['side']} | {r.get('run', 0)} | {r['tuned_us']} "
                f"({' / '.join(map(str, r['runs_us']))}) | {ratio(r['tuned_us'], c.get('tuned_us'))} | "
                f"{r['wall_s']} | {ratio(r['wall_s'], c.get('wall_s'))} | {r['measured']} | "
                f"{r['from_store']} | {r['transfer_applied']} / {r['transfer_tried']} |")
        p = m["plain"]
        if p:
            lines.append(f"| {name} | {p['trials']} | plain MetaSchedule | 0 | {p['tuned_us']} "
                         f"({' / '.join(map(str, p['runs_us']))}) | | {p['wall_s']} | | "
                         f"{p['measured']} ({p['valid']} valid) | | |")
        lines.append(f"| {name} | | untuned | | {m['untuned_us']} | | | | | | |")
    lines += ["", "Host CPU seconds per job, by part of its rounds (summary.json's account; the "
              "mean of the runs a side; set-up is the cost model's and the search's):", "",
              *cpu_table(results["models"])]
    lines += ["", "The warm store's cost model, checked on held-out workloads per operator family "
              "(workers/metaschedule/heldout.py):", "", *results["heldout"]]
    lines += ["", "Targets (issue 47), per model:", ""]
    lines += [f"- {v}" for m in results["models"].values() for v in m["verdicts"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
