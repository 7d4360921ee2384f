"""Benchmarks: the farm against plain MetaSchedule and torch, measured side by side in one run.

    python bench/run.py [--trials 16] [--models resnet,transformer] [--repeats 1]
                        [--quality resnet,mobile,transformer] [--threads 1,4]
                        [--scaling resnet]
                        [--phones 1,2,4] [--delay-s 0.5] [--scaling-trials 8] [--out bench]

Every section runs on this machine, one thing at a time (never two measured things at once):

1. Throughput and overhead (`--models`): for each model, `bench/plain.py` (plain
   `ms.tune_tasks`: LocalBuilder, RPCRunner) and `farm submit` (embedded: its own Redis,
   tracker, worker), each in a fresh process, same tasks, same trials per task, 2 emulated
   phones of 1 thread each, fresh stores. Ratios of whole-process wall times and of the
   tuning phases, trials per minute, and the tuned models' latency, both re-timed here.
   With `--repeats R`, each side tunes R times (interleaved): medians, and every run's
   tuned latency, which shows how much tuning runs differ from one another at this budget.
2. Resubmit: the same model submitted again to the same farm home: wall ratio, trials (0).
3. Scaling (`--scaling`): `farm submit` with 1, 2, 4 emulated phones that each add
   `--delay-s` to every measurement (farm/devices/phone.py, like a real phone's upload and run).
   Measurement throughput = trials / seconds the batches spent on the phones; parallel
   efficiency = throughput(n) / (n x throughput(1)).
4. Quality (`--quality`, for each of `--threads`): torch eager, untuned TVM and farm-tuned
   TVM, all timed in one fresh process (bench/latency.py) with the threads the farm tuned
   for, plus the trials each task needed to get within 10 % of its final best (from the
   store's records, in measurement order). With N > 1 threads, the farm tunes cpu-local with
   `threads = N` (a farm.toml) on cores // N emulated phones of N threads each.

Every TVM build is for the target the farm tunes cpu-local for (this CPU as mcpu,
num-cores = threads), plain MetaSchedule's included (bench/latency.py's bench_profile).

Writes <out>/results.json and <out>/results.md. Read the ratios: the machine is noisy, and
both sides of a ratio ran in the same minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

from latency import latencies  # bench/: this script's folder

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

os.environ.setdefault("TVM_NUM_THREADS", "1")
WITHIN = 0.10  # "trials to within 10 % of the final best"


def plain_metaschedule(model: Path, trials: int, work: Path) -> dict[str, Any]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "plain.py"), str(model),
                           "--trials", str(trials), "--phones", "2", "--work", str(work)],
                          capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"plain MetaSchedule failed:\n{proc.stderr[-3000:]}")
    return {**json.loads((work / "plain.json").read_text()), "process_wall_s": wall}


def bench_env() -> dict[str, str]:
    """This process's environment without FARM_* settings (and with no ./farm.toml read: the
    bench runs `farm submit` in ROOT, FARM_CONFIG names the profile explicitly where it
    matters): what the farm tunes for must be what the bench times (bench_profile)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}


def farm_submit(model: Path, trials: int, out: Path, home: Path,
                env: dict[str, str] | None = None) -> dict[str, Any]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "farm", "submit", str(model),
                           "--trials-per-task", str(trials), "--round-trials", str(trials),
                           "--out", str(out), "--force"], capture_output=True, text=True,
                          env={**bench_env(), "FARM_HOME": str(home), **(env or {})})
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"farm submit failed:\n{proc.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"wall_s": wall, "tuning_s": summary["tuning_s"], "summary": summary,
            "trials": sum(t["trials_measured"] for t in summary["tasks"]),
            "measure_s": sum(t.get("measure_s", 0.0) for t in summary["tasks"]),
            "log": str(out / "best")}


def trials_to_within(home: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """Per task, the trials (in measurement order) until its best was within WITHIN of the
    task's final best; summed over tasks, against all trials measured."""
    from farm.core.config import load_config
    from farm.local.embedded import embedded_store_url
    from farm.store import open_store

    needed, total = 0, 0
    with embedded_store_url(load_config(env={"FARM_HOME": str(home)})) as url:
        store = open_store(url)
        for task in summary["tasks"]:
            recs = sorted(store.records(task["workload_key"]), key=lambda r: r.measured_at)
            valid = [r.run_us for r in recs if r.valid]
            if not valid:
                continue
            final, best = min(valid), float("inf")
            for i, rec in enumerate(recs, start=1):
                if rec.valid:
                    best = min(best, rec.run_us)
                if best <= final * (1 + WITHIN):
                    needed += i
                    break
            total += len(recs)
        store.close()
    return {"trials_to_within_10pct": needed, "trials_total": total}


def throughput(name: str, model: Path, trials: int, work: Path,
               repeats: int = 1) -> tuple[dict, dict]:
    """Plain and farm, `repeats` times each, interleaved (plain, farm, plain, farm, ...) on
    fresh stores; then the first farm's home once more (resubmit). Wall times and tuned
    latencies are medians over the repeats; the tuned latencies' ranges show how much one
    tuning run differs from the next at this budget (the seed: the noise of the comparison)."""
    plains, firsts = [], []
    for i in range(repeats):
        plains.append(plain_metaschedule(model, trials, work / f"plain-{name}-{i}"))
        print(json.dumps({"model": name, "run": i, "side": "plain",
                          "tune_s": round(plains[-1]["tune_s"], 1), "db": plains[-1]["db"]}),
              flush=True)
        firsts.append(farm_submit(model, trials, work / f"farm-{name}-{i}",
                                  work / f"home-{name}-{i}", env=threads_env(1, work)))
        print(json.dumps({"model": name, "run": i, "side": "farm",
                          "tuning_s": round(firsts[-1]["tuning_s"], 1),
                          "log": firsts[-1]["log"]}), flush=True)
    home = work / f"home-{name}-0"
    again = farm_submit(model, trials, work / f"farm2-{name}", home, env=threads_env(1, work))
    lat = latencies(model, 1, [p["db"] for p in plains] + [f["log"] for f in firsts])
    plain_us, farm_us = lat["tuned_us"][:repeats], lat["tuned_us"][repeats:]
    plain_wall = median([p["process_wall_s"] for p in plains])
    farm_wall = median([f["wall_s"] for f in firsts])
    plain_tune = median([p["tune_s"] for p in plains])
    farm_tune = median([f["tuning_s"] for f in firsts])
    first = firsts[0]
    row = {
        "model": name, "tasks": plains[0]["tasks"], "trials_per_task": trials,
        "runs": repeats,
        "plain_wall_s": round(plain_wall, 1), "farm_wall_s": round(farm_wall, 1),
        "ratio_wall": round(farm_wall / plain_wall, 3),
        "plain_tune_s": round(plain_tune, 1), "farm_tuning_s": round(farm_tune, 1),
        "ratio_tuning": round(farm_tune / plain_tune, 3),
        "plain_trials": plains[0]["trials"], "farm_trials": first["trials"],
        "plain_trials_per_min": round(plains[0]["trials"] / plain_tune * 60, 1),
        "farm_trials_per_min": round(first["trials"] / farm_tune * 60, 1),
        "tuned_us_plain": round(median(plain_us), 1), "tuned_us_farm": round(median(farm_us), 1),
        "ratio_tuned_us": round(median(farm_us) / median(plain_us), 3),
        "tuned_us_plain_runs": " / ".join(f"{u:.1f}" for u in plain_us),
        "tuned_us_farm_runs": " / ".join(f"{u:.1f}" for u in farm_us),
        "resubmit_wall_s": round(again["wall_s"], 1),
        "resubmit_trials_measured": again["trials"],
        "ratio_resubmit": round(again["wall_s"] / first["wall_s"], 3),
    }
    quality = quality_row(name, lat, first, home, farm_us[0])
    return row, quality


def quality_row(name: str, lat: dict[str, Any], farm: dict[str, Any], home: Path,
                tuned: float) -> dict[str, Any]:
    """A model's torch, untuned and tuned latencies (`lat`, from bench/latency.py, with the
    threads the farm tuned it for) and how fast its tuning got near its final best."""
    if lat["target"] != farm["summary"]["target"]:  # timed as tuned, or the row means nothing
        raise SystemExit(f"{name}: timed for {lat['target']}, the farm tuned for "
                         f"{farm['summary']['target']}")
    torch_us, untuned = lat["torch_us"], lat["untuned_us"]
    return {"model": name, "threads": lat["threads"], "tasks": len(farm["summary"]["tasks"]),
            "trials_per_task": farm["summary"]["trials_per_task"],
            "torch_us": round(torch_us, 1), "untuned_us": round(untuned, 1),
            "tuned_us": round(tuned, 1), "tuned_vs_untuned": round(untuned / tuned, 2),
            "tuned_vs_torch": round(torch_us / tuned, 2),
            "tuned_over_torch": round(tuned / torch_us, 3),
            **trials_to_within(home, farm["summary"])}


def cores() -> int:
    """The cores this process may use (its affinity and cgroup quota, not the machine's
    logical CPUs)."""
    from farm.core.cores import usable_cores

    return usable_cores()


def thread_counts(asked: str) -> list[int]:
    """The thread counts of `--threads` this machine has cores for (the others are said and
    skipped: 4 threads on 2 cores would time the scheduler, not the kernels)."""
    counts = sorted({int(n) for n in asked.split(",") if n.strip()})
    for n in (n for n in counts if n > cores()):
        print(f"bench: skipping {n} threads: this process has {cores()} cores", file=sys.stderr)
    return [n for n in counts if 1 <= n <= cores()]


def threads_env(threads: int, work: Path) -> dict[str, str]:
    """`farm submit`'s environment to tune cpu-local for `threads` threads: a farm.toml that
    says so, and with N > 1 threads as many emulated phones as fit the cores with N threads
    each (their measurements must not share cores; 1 thread: the default 2 phones)."""
    toml = work / f"farm-{threads}-threads.toml"
    toml.write_text(f"[profiles.cpu-local]\nthreads = {threads}\n")
    env = {"FARM_CONFIG": str(toml)}
    if threads > 1:
        env["FARM_PHONES"] = str(max(1, cores() // threads))
    return env


def scaling(model: Path, trials: int, phones: list[int], delay_s: float,
            work: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for n in phones:
        run = farm_submit(model, trials, work / f"scale-{n}", work / f"home-scale-{n}",
                          env={"FARM_PHONES": str(n), "FARM_PHONE_DELAY_S": str(delay_s)})
        rows.append({"phones": n, "delay_s": delay_s, "trials": run["trials"],
                     "measure_s": round(run["measure_s"], 1),
                     "tuning_s": round(run["tuning_s"], 1),
                     "measured_per_s": round(run["trials"] / run["measure_s"], 3),
                     "job_trials_per_min": round(run["trials"] / run["tuning_s"] * 60, 1)})
        print(json.dumps(rows[-1]), flush=True)
    base = rows[0]["measured_per_s"] / rows[0]["phones"] if rows else 0.0
    job_base = rows[0]["job_trials_per_min"] / rows[0]["phones"] if rows else 0.0
    for row in rows:
        row["efficiency"] = round(row["measured_per_s"] / (row["phones"] * base), 3)
        row["job_efficiency"] = round(row["job_trials_per_min"] / (row["phones"] * job_base), 3)
    return rows


def table(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return ["(not run)"]
    cols = list(rows[0])
    return (["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            + ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows])


HOW = {
    "throughput": (
        "Each side a fresh process on a fresh store, one after the other: plain = "
        "bench/plain.py (ingest, extract, tracker + 2 phones, ms.tune_tasks with LocalBuilder, "
        "RPCRunner max_workers=2, XGB, 16 trials per iteration, LocalBuilder timeout 300 s instead "
        "of 30 s, with which every build timed out here; then build); farm = `farm "
        "submit` on the embedded default (its Redis, tracker, 2 phones, one worker; one round "
        "per task; it also builds the untuned model, checks numerics against torch and times "
        "torch/untuned/tuned on a phone). ratio_wall = whole processes; ratio_tuning = plain's "
        "tune_tasks call vs the farm's first round sent -> last task done (includes the "
        "worker's warm-up when it was not done yet). Both tuned models are re-timed here, "
        "same build, VM time_evaluator, 1 thread, median of 30 repeats of >= 5 runs (min 50 ms), "
        "in a fresh process (bench/latency.py), for the farm's target (this CPU as mcpu), 3 "
        "times, the logs in another order each time (rotated, every other pass reversed): "
        "each log's latency is the median of its 3 timings. "
        "runs = tuning runs per side (interleaved plain, farm, plain, farm...); wall times and "
        "tuned_us are medians over them, *_runs list every run's tuned latency; ratio_tuned_us "
        "= farm / plain median tuned latency (< 1: the farm's model is faster)."),
    "resubmit": "the same model again on the same farm home, right after the first submit.",
    "scaling": (
        "`farm submit` with FARM_PHONES=n and FARM_PHONE_DELAY_S: every emulated phone sleeps "
        "that long in each measurement session (farm/devices/phone.py). measure_s = seconds the "
        "batches were on the phones (sent -> results back, summed over rounds); "
        "measured_per_s = trials / measure_s; efficiency = measured_per_s(n) / "
        "(n x measured_per_s(1)). job_* = the same over the whole tuning phase, which also "
        "searches and builds on the host (not parallel over phones)."),
    "quality": (
        "All three latencies timed in a fresh process (bench/latency.py), one after another, "
        "3 times (each a fresh process; medians of the 3), "
        "with `threads` threads (torch.set_num_threads, TVM_NUM_THREADS): torch eager = median "
        "of 150 runs, timed before and after TVM, the lower of the two; TVM = median of 30 repeats of >= 5 runs, built for the target the farm "
        "tuned (this CPU as mcpu, num-cores = threads; checked against the job's summary). "
        "With threads N > 1 the farm tuned cpu-local with `threads = N` on cores // N phones "
        "of N threads (1 thread: 2 phones). tuned_over_torch < 1: the tuned model is faster "
        "than torch. A model also in --models: its 1-thread row is from the first of its "
        "--repeats farm runs (the throughput table has the medians over all of them). "
        "tuned = the farm's best log at the stated "
        "trials per task. trials_to_within_10pct: per task, the trials (in measurement order) "
        "until its best was within 10 % of its final best, summed over tasks; trials_total = "
        "all trials measured."),
}


def scaling_section(args: argparse.Namespace, scale: list[dict[str, Any]]) -> list[str]:
    if not args.scaling:
        return ["## Scaling with phones", "", "(not run: --scaling \"\")", ""]
    return [f"## Scaling with phones ({args.scaling}, {args.scaling_trials} trials per task, "
            f"{args.delay_s} s added per measurement)", "", HOW["scaling"], "", *table(scale), ""]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=16)
    p.add_argument("--repeats", type=int, default=1,
                   help="tune each --models model this many times on each side (medians)")
    # plain MetaSchedule alone took 11-19 min on the example transformer (17 tasks) here:
    # `make bench` compares on the CNN, `make bench-full` on both
    p.add_argument("--models", default="resnet")
    p.add_argument("--quality", default="resnet,mobile,transformer")
    p.add_argument("--threads", default="1",
                   help="thread counts of the quality section, e.g. 1,4 (those above this "
                        "machine's cores are skipped)")
    p.add_argument("--scaling", default="resnet")
    p.add_argument("--phones", default="1,2,4")
    p.add_argument("--delay-s", type=float, default=0.5)
    p.add_argument("--scaling-trials", type=int, default=8)
    p.add_argument("--out", default=str(ROOT / "bench"))
    p.add_argument("--work", default="",
                   help="keep the stores, logs and tuned models here (default: a temporary "
                        "folder, removed at the end)")
    args = p.parse_args()
    out = Path(args.out)
    if args.work:  # kept: a long run's tuned logs can be timed again after it (bench/latency.py)
        work = Path(args.work)
        work.mkdir(parents=True, exist_ok=True)
        return run_all(args, out, work)
    work = Path(tempfile.mkdtemp(prefix="farm-bench-"))
    try:
        return run_all(args, out, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_all(args: argparse.Namespace, out: Path, work: Path) -> int:
    t0 = time.monotonic()
    subprocess.run([sys.executable, str(ROOT / "examples" / "make_models.py"), str(work)],
                   check=True, capture_output=True)
    rows, quality = [], []
    for name in filter(None, args.models.split(",")):
        row, q = throughput(name, work / f"{name}.pt2", args.trials, work, args.repeats)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if name in args.quality.split(","):
            quality.append(q)
            print(json.dumps(q), flush=True)
    for threads in thread_counts(args.threads):
        for name in filter(None, args.quality.split(",")):
            if any(q["model"] == name and q["threads"] == threads for q in quality):
                continue
            model, tag = work / f"{name}.pt2", f"{name}-{threads}t"
            home = work / f"home-q-{tag}"
            farm = farm_submit(model, args.trials, work / f"farm-q-{tag}", home,
                               env=threads_env(threads, work))
            lat = latencies(model, threads, [farm["log"]])
            quality.append(quality_row(name, lat, farm, home, lat["tuned_us"][0]))
            print(json.dumps(quality[-1]), flush=True)
    scale = []
    if args.scaling:
        scale = scaling(work / f"{args.scaling}.pt2", args.scaling_trials,
                        [int(n) for n in args.phones.split(",")], args.delay_s, work)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
            "bench_wall_s": round(time.monotonic() - t0), "how": HOW,
            "args": " ".join(sys.argv[1:]),
            "scaling_model": args.scaling, "scaling_trials_per_task": args.scaling_trials}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(
        {"meta": meta, "throughput": rows, "quality": quality, "scaling": scale}, indent=2))
    lines = [f"# tunefarm benchmarks ({meta['date']}, {meta['machine']})", "",
             f"`python bench/run.py {meta['args']}` ran {meta['bench_wall_s']} s.", "",
             "## Throughput and overhead: farm vs plain MetaSchedule (and resubmit)", "",
             HOW["throughput"], "", "Resubmit: " + HOW["resubmit"], "", *table(rows), "",
             "## Quality: torch vs untuned vs tuned", "", HOW["quality"], "", *table(quality),
             "", *scaling_section(args, scale)]
    (out / "results.md").write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
