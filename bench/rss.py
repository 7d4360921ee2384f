"""Memory of a worker host over a long run: RSS of the worker's whole process tree (Celery
main, pool child, warm build processes, runner pool) sampled while it runs >= 50 rounds.

    python bench/rss.py [--rounds-per-task 12] [--out bench]

One embedded-like farm (its own Redis, tracker, 2 emulated phones, one worker), one job on
the example CNN with rounds of 2 trials, so rounds are many and short. Writes
<out>/rss.json and <out>/rss.md: RSS after warm-up, after each tenth of the rounds, and the
growth per round over the second half (where a leak would show; the first rounds load code).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def tree_rss_mb(pid: int) -> float:
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds-per-task", type=int, default=12,
                    help="rounds of 2 trials per task (the CNN has 5 tasks with a search space)")
    ap.add_argument("--out", default=str(ROOT / "bench"))
    args = ap.parse_args()
    from farm.devices.tracker import wait_for_phones
    from farm.local import services
    from farm.store import open_store

    work = Path(tempfile.mkdtemp(prefix="farm-rss-"))
    model = work / "resnet.pt2"
    subprocess.run([sys.executable, str(ROOT / "examples" / "make_models.py"), str(work)],
                   check=True, capture_output=True)
    group = services.ServiceGroup()
    samples: list[tuple[float, int, float]] = []  # (time, rounds done, MB)
    try:
        rsvc, url = services.start_redis(work / "redis", work / "logs")
        group.add(rsvc)
        tsvc, tracker = services.start_tracker(work / "logs")
        group.add(tsvc)
        for i in range(2):
            group.add(services.start_phone(tracker, "cpu-local", i, work / "logs"))
        wait_for_phones(tracker, "cpu-local", 2, 60)
        worker = group.add(services.start_worker(tracker, url, work / "logs",
                                                 env={"FARM_ROUND_TRIALS": "2"}))
        store = open_store(url)
        tasks_env = {"FARM_BROKER_URL": url, "FARM_HOME": str(work / "home")}
        import os

        per_task = 2 * args.rounds_per_task
        client = subprocess.Popen(
            [sys.executable, "-m", "farm", "submit", str(model), "--trials-per-task",
             str(per_task), "--round-trials", "2", "--out", str(work / "out"), "--tracker",
             tracker], env={**os.environ, **tasks_env}, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        stop = threading.Event()

        def sample() -> None:
            t0 = time.monotonic()
            while not stop.is_set():
                rounds = 0
                for job in store.job_ids():
                    rounds += sum(s.rounds for s in store.task_states(job).values())
                samples.append((time.monotonic() - t0, rounds, tree_rss_mb(worker.pid)))
                time.sleep(2)

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        _, err = client.communicate(timeout=7200)
        stop.set()
        th.join()
        if client.returncode != 0:
            print(err[-3000:], file=sys.stderr)
            return 1
    finally:
        group.stop()
        shutil.rmtree(work, ignore_errors=True)
    rounds = max(r for _, r, _ in samples)
    marks = []
    for k in range(1, 11):
        want = rounds * k // 10
        at = next((s for s in samples if s[1] >= want), samples[-1])
        marks.append({"rounds": at[1], "t_s": round(at[0], 1), "rss_mb": round(at[2], 1)})
    # least-squares slope of RSS over rounds done, second half (a single peak sample, e.g. a
    # build process at its largest, must not decide it)
    half = [(r, mb) for _, r, mb in samples if rounds // 2 <= r < rounds]
    growth = 0.0
    if len({r for r, _ in half}) > 1:
        mr = sum(r for r, _ in half) / len(half)
        mm = sum(mb for _, mb in half) / len(half)
        growth = (sum((r - mr) * (mb - mm) for r, mb in half)
                  / sum((r - mr) ** 2 for r, _ in half))
    result = {"machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores",
              "date": time.strftime("%Y-%m-%d"), "rounds": rounds,
              "rss_mb_first": round(samples[0][2], 1), "marks": marks,
              "growth_mb_per_round_second_half": round(growth, 3),
              "samples": [[round(t, 1), r, round(mb, 1)] for t, r, mb in samples],
              "how": "RSS of the worker's process tree (psutil), sampled every 2 s; one "
                     "worker, 2 emulated phones, rounds of 2 trials on the example CNN"}
    out = Path(args.out)
    (out / "rss.json").write_text(json.dumps(result, indent=2))
    lines = [f"# Worker host memory over {rounds} rounds ({result['date']}, {result['machine']})",
             "", result["how"] + ".", "", "| rounds done | time (s) | worker tree RSS (MB) |",
             "|---|---|---|"]
    lines += [f"| {m['rounds']} | {m['t_s']} | {m['rss_mb']} |" for m in marks]
    lines += ["", f"Growth over the second half (least-squares slope of RSS over rounds): "
                  f"{growth:.3f} MB per round."]
    (out / "rss.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
