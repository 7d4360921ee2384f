"""A simulated fleet against one real Redis: does the store hold a lab of a thousand phones?

    python bench/fleet.py [--hosts 100] [--phones 10] [--rate 1000] [--minutes 10]
                          [--fill 10000000] [--workloads 5000] [--procs 2] [--json OUT]

Phases, on a private redis-server (AOF on, `appendfsync everysec`, as `farm up` runs it):

1. **live**: `--hosts` worker hosts of `--phones` phones each, simulated by `--procs`
   processes, drive the store's real paths at `--rate` measurements/s for `--minutes`:
   each phone's measurement is one `add_record` (keep_best.lua: dedup, best, K hot, spool,
   job counters) of a record made from a real MetaSchedule record (bench/fleet_record.json)
   with its sampling decisions drawn at random; each host runs rounds of 32 trials under a
   round lease (acquire_round, finish_round), writes its task state per round and its
   heartbeat every 5 s. One more process is the supervisor's leader: it drains the spool
   into the archive (farm/store/cold.py) every 5 s. Fake phones answer at once. Reported:
   the rate reached, commit latency p50/p99, drain throughput, Redis's CPU.
2. **sweep**: the real Supervisor.sweep() over 1,000 and 10,000 active tasks whose rounds
   are held by live leases (the common case: nothing to send again).
3. **fill**: the store filled to `--fill` measurements over `--workloads` workloads through
   the same keep_best.lua (pipelined; records pre-packed, so the client is not the limit;
   the spool is emptied without writing the archive: its path is phase 1's). Redis memory
   per measurement at each decade; then an AOF rewrite and a restart (AOF load) timed.
4. **train**: (with `--train-records N`, the live jobs' 500 workloads first grown to N
   records in all through keep_best.lua, pipelined, and the spool drained into the
   archive by the leader's drain) a key's cost model reads its records (Redis's whole ones and, in one pass, a
   sample of the archive written in phase 1) as `workers/round/costmodel.train` does;
   XGBoost's training on that many samples of synthetic features (the bench has no TVM
   workloads to featurize).

Writes a JSON summary (`--json`); bench/fleet.md has the runs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from farm.core import keys  # noqa: E402
from farm.core.messages import JobSpec, RoundRequest, TuneTask  # noqa: E402
from farm.store import StoredRecord, open_store  # noqa: E402
from farm.store.hosts import HostBeat  # noqa: E402
from farm.store.jobs import TaskState  # noqa: E402
from farm.store.packing import entry_of, pack, zdict_of  # noqa: E402

TEMPLATE = json.loads((Path(__file__).parent / "fleet_record.json").read_text())
DEVICE_KEY = "fleet-phone"
TIR = json.dumps(TEMPLATE["record"]) * 10  # a workload's TIR JSON stand-in, of its size
TRIALS = 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(folder: Path, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
         "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
         "--maxmemory", "0", "--protected-mode", "yes"],
        stdout=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    for _ in range(100000):
        try:
            if client.info("persistence")["loading"] == 0:
                return proc
        except redis.RedisError:
            pass
        time.sleep(0.01)
    raise SystemExit("redis-server did not start")


def make_record(rng: random.Random, wk: str, job: str, host: str) -> StoredRecord:
    """A real record's trace with its decisions drawn at random: a new candidate."""
    insts, decisions = TEMPLATE["record"][0]
    drawn = [[i, [rng.choice((1, 2, 4, 8, 16)) for _ in d] if isinstance(d, list)
              else rng.randrange(8)] for i, d in decisions]
    record = [[insts, drawn], *TEMPLATE["record"][1:]]
    fail = rng.random() < 0.05
    return StoredRecord(workload_key=wk, candidate=f"{rng.getrandbits(128):032x}",
                        record=record, run_us=None if fail else rng.uniform(20, 400),
                        error_class="runtime" if fail else None, job_id=job, host=host,
                        measured_at=time.time(), tvm="0.27.0.post1")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


# --- phase 1: live -------------------------------------------------------------------------
def host_proc(url: str, index: int, hosts: list[str], phones: int, rate: float, until: float,
              jobs: list[JobSpec], out: mp.Queue) -> None:
    store = open_store(url)
    rng = random.Random(index)
    latencies: list[float] = []
    rounds: dict[str, tuple[RoundRequest, int]] = {}
    beats: dict[str, float] = {}
    period = 1.0 / rate
    next_at = time.monotonic()
    n = 0
    while time.monotonic() < until:
        host = hosts[n % len(hosts)]
        now = time.time()
        if now - beats.get(host, 0) > 5:
            store.publish_host(HostBeat(name=host, tracker="127.0.0.1:9190",
                                        phones={DEVICE_KEY: {"total": phones, "free": phones}},
                                        beat_at=now), ttl_s=30)
            beats[host] = now
        req, done = rounds.get(host, (None, TRIALS))
        if done >= TRIALS:
            if req is not None:
                store.finish_round(req.logical_id, f"{req.round_id}|{host}|1")
            job = rng.choice(jobs)
            wk = rng.choice(job.workload_keys)
            req = RoundRequest(job_id=job.job_id, workload_key=wk, task_name="t",
                               round_index=rng.randrange(10**9), trials=TRIALS,
                               target_trials=10**6, max_rounds=0, device_key=DEVICE_KEY)
            store.acquire_round(req.logical_id, f"{req.round_id}|{host}|1", 60)
            store.set_task_state(job.job_id, wk, TaskState(state="tuning", host=host,
                                                           updated_at=now, round=req.to_json()))
            done = 0
        rec = make_record(rng, req.workload_key, req.job_id, host)
        t0 = time.perf_counter()
        store.add_record(rec)
        latencies.append(time.perf_counter() - t0)
        rounds[host] = (req, done + 1)
        n += 1
        next_at += period
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    out.put(latencies)


def drainer_proc(url: str, archive: str, until: float, out: mp.Queue) -> None:
    from farm.store.cold import drain

    store = open_store(url, archive=archive)
    moved, busy = 0, 0.0
    while time.monotonic() < until + 5:
        t0 = time.perf_counter()
        moved += drain(store, store.archive)
        busy += time.perf_counter() - t0
        time.sleep(max(0.0, 5 - (time.perf_counter() - t0)))
        if time.monotonic() >= until and not store.spool_size():
            break
    out.put({"moved": moved, "busy_s": busy})


def setup_jobs(url: str, jobs: int, tasks: int, prefix: str) -> list[JobSpec]:
    store = open_store(url)
    out = []
    for j in range(jobs):
        wks = [f"{prefix}{j:04d}{t:04d}" for t in range(tasks)]
        spec = JobSpec(job_id=f"{prefix}job{j}", model="m", device_key=DEVICE_KEY, target={},
                       trials_per_task=10**6, round_trials=TRIALS, workload_keys=wks,
                       task_names={w: "t" for w in wks}, weights={w: 1 for w in wks},
                       created_at=time.time())
        for wk in wks:  # filed as a job files its tasks (a ~40 KB TIR each, compressed)
            store.put_workload(TuneTask(name="t", workload_key=wk, weight=1,
                                        mod_json=TIR, target={"kind": "llvm"},
                                        device_key=DEVICE_KEY), spec.job_id)
        store.put_job(spec)
        store.set_active(spec.job_id, True)
        out.append(spec)
    return out


def live(url: str, archive: str, args: argparse.Namespace) -> dict:
    jobs = setup_jobs(url, 10, 50, "live")
    until = time.monotonic() + args.minutes * 60
    hosts = [f"host-{h:03d}" for h in range(args.hosts)]
    out: mp.Queue = mp.Queue()
    per = [hosts[i::args.procs] for i in range(args.procs)]
    procs = [mp.Process(target=host_proc, args=(url, i, per[i], args.phones,
                                               args.rate / args.procs, until, jobs, out))
             for i in range(args.procs)]
    drainer_out: mp.Queue = mp.Queue()
    drainer = mp.Process(target=drainer_proc, args=(url, archive, until, drainer_out))
    cpu0 = redis.Redis.from_url(url).info("cpu")
    t0 = time.monotonic()
    for p in [*procs, drainer]:
        p.start()
    latencies: list[float] = []
    for _ in procs:
        latencies.extend(out.get())
    wall = time.monotonic() - t0
    drained = drainer_out.get()
    for p in [*procs, drainer]:
        p.join()
    cpu1 = redis.Redis.from_url(url).info("cpu")
    redis_cpu = (cpu1["used_cpu_sys"] + cpu1["used_cpu_user"]
                 - cpu0["used_cpu_sys"] - cpu0["used_cpu_user"])
    return {"measurements": len(latencies), "wall_s": round(wall, 1),
            "rate_per_s": round(len(latencies) / wall, 1),
            "commit_p50_ms": round(percentile(latencies, 0.5) * 1e3, 3),
            "commit_p99_ms": round(percentile(latencies, 0.99) * 1e3, 3),
            "commit_max_ms": round(max(latencies) * 1e3, 1),
            "redis_cpu_share": round(redis_cpu / wall, 3),
            "archived": drained["moved"], "drain_busy_s": round(drained["busy_s"], 1)}


# --- phase 2: the supervisor's sweep ---------------------------------------------------------
def sweep(url: str, tasks: int) -> dict:
    from farm.jobs.supervisor import Supervisor
    from farm.store import open_broker

    store = open_store(url)
    for job_id in store.active_jobs():
        store.set_active(job_id, False)
    jobs = setup_jobs(url, tasks // 100, 100, f"sw{tasks}-")
    for job in jobs:
        for wk in job.workload_keys:
            req = RoundRequest(job_id=job.job_id, workload_key=wk, task_name="t", round_index=0,
                               trials=TRIALS, target_trials=TRIALS, max_rounds=1,
                               device_key=DEVICE_KEY)
            store.acquire_round(req.logical_id, f"{req.round_id}|another-machine|7", 600)
            store.set_task_state(job.job_id, wk, TaskState(state="tuning", updated_at=0,
                                                           round=req.to_json()))
    sup = Supervisor(app=None, store=store, broker=open_broker(url), node="bench",
                     interval_s=5, grace_s=1)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        sent = sup.sweep()
        times.append(time.perf_counter() - t0)
        assert not sent, "a live round was sent again"
    for job in jobs:
        store.set_active(job.job_id, False)
    return {"active_tasks": tasks, "sweep_s": round(min(times), 3),
            "sweep_s_max": round(max(times), 3)}


# --- phase 3: fill, memory, AOF ----------------------------------------------------------------
def fill_proc(url: str, index: int, wks: list[str], count: int, out: mp.Queue) -> None:
    store = open_store(url)
    rng = random.Random(1000 + index)
    r = store.r
    keep_best = store._conn.scripts.keep_best  # noqa: SLF001 - the commit's script, pipelined
    variants: dict[str, list[tuple[str, bytes, str]]] = {}
    for wk in wks:
        zdict = zdict_of(make_record(rng, wk, "fill", "h"))
        r.hsetnx(keys.workload(wk), "zdict", zdict)  # what add_record sets (unsqueezed here)
        variants[wk] = []
        for _ in range(8):
            rec = make_record(rng, wk, "fill", "h")
            variants[wk].append((entry_of(rec), pack(rec, zdict),
                                 "" if rec.run_us is None else repr(rec.run_us)))
    pipe = r.pipeline(transaction=False)
    for n in range(count):
        wk = wks[n % len(wks)]
        entry, blob, us = variants[wk][n % 8]
        if us:
            us = repr(rng.uniform(20, 400))
        keep_best(keys=[keys.records(wk), keys.best(wk), keys.job_measured("fill"),
                        keys.job_counts("fill"), keys.unverified(wk), keys.hot(wk),
                        keys.spool()],
                  args=[f"{rng.getrandbits(128):032x}", entry, blob, us, wk, "1", "1",
                        "0.27.0.post1", str(store.hot_records)], client=pipe)
        if n % 500 == 499:
            pipe.execute()
            if index == 0:
                r.ltrim(keys.spool(), 1, 0)  # emptied: phase 1 measured the archive's path
    pipe.execute()
    out.put(count)


def fill(url: str, folder: Path, port: int, args: argparse.Namespace) -> dict:
    client = redis.Redis.from_url(url)
    steps = sorted({s for s in (10**5, 10**6, 2 * 10**6, 5 * 10**6, args.fill)
                    if s <= args.fill})
    wks = [f"fill{w:06d}" for w in range(args.workloads)]
    done = 0
    points = []
    base = client.info("memory")["used_memory"]  # what the phases before left
    t0 = time.monotonic()
    for step in steps:
        out: mp.Queue = mp.Queue()
        share = (step - done) // args.procs
        procs = [mp.Process(target=fill_proc, args=(url, i + step, wks[i::args.procs], share,
                                                   out)) for i in range(args.procs)]
        for p in procs:
            p.start()
        for _ in procs:
            done += out.get()
        for p in procs:
            p.join()
        client.ltrim(keys.spool(), 1, 0)
        mem = client.info("memory")
        total = sum(int(v) for k, v in client.hgetall(keys.job_counts("fill")).items()
                    if k.endswith(b"|measurements"))
        points.append({"measurements": total, "used_memory": mem["used_memory"],
                       "bytes_per_measurement": round((mem["used_memory"] - base) / total, 1),
                       "at_s": round(time.monotonic() - t0)})
        print(f"  fill: {points[-1]}", flush=True)
    t1 = time.monotonic()
    client.bgrewriteaof()
    while True:
        p = client.info("persistence")
        if not p["aof_rewrite_in_progress"] and not p["aof_rewrite_scheduled"]:
            break
        time.sleep(0.2)
    rewrite_s = time.monotonic() - t1
    aof_bytes = sum(f.stat().st_size for f in (folder / "appendonlydir").iterdir())
    client.shutdown(nosave=False)
    t2 = time.monotonic()
    proc = start_redis(folder, port)
    restart_s = time.monotonic() - t2
    return {"points": points, "aof_rewrite_s": round(rewrite_s, 1), "aof_bytes": aof_bytes,
            "restart_s": round(restart_s, 1), "redis": proc}


# --- phase 4: the key's cost model ---------------------------------------------------------------
def grow_proc(url: str, index: int, wks: list[str], count: int, out: mp.Queue) -> None:
    """`count` new records (distinct candidates, real traces) for `wks`, committed through
    keep_best.lua pipelined, their whole records spooled for the archive as in a round."""
    store = open_store(url)
    rng = random.Random(7000 + index)
    r = store.r
    keep_best = store._conn.scripts.keep_best  # noqa: SLF001 - the commit's script, pipelined
    zdicts = {}
    for wk in wks:  # set by the workload's first record, as add_record does
        zdicts[wk] = store._records._zdict(wk, make_record(rng, wk, "grow", "h"))  # noqa: SLF001
    pipe = r.pipeline(transaction=False)
    for n in range(count):
        wk = wks[n % len(wks)]
        rec = make_record(rng, wk, "grow", f"host-{n % 100:03d}")
        keep_best(keys=[keys.records(wk), keys.best(wk), "", "", keys.unverified(wk),
                        keys.hot(wk), keys.spool()],
                  args=[rec.candidate, entry_of(rec), pack(rec, zdicts[wk]),
                        "" if rec.run_us is None else repr(rec.run_us), wk, "1", "1",
                        rec.tvm, str(store.hot_records)], client=pipe)
        if n % 500 == 499:
            pipe.execute()
    pipe.execute()
    out.put(count)


def grow(url: str, archive: str, args: argparse.Namespace) -> dict:
    """The live jobs' workloads grown to `--train-records` records in all, the spool drained
    into the archive (the leader's drain, timed)."""
    from farm.store.cold import drain

    store = open_store(url, archive=archive)
    if not [j for j in store.job_ids() if j.startswith("live")]:
        setup_jobs(url, 10, 50, "live")
    wks = sorted({wk for job in store.job_ids() if job.startswith("live")
                  for wk in (store.get_job(job).workload_keys if store.get_job(job) else [])})
    have = sum(store.record_count(wk) for wk in wks)
    want = max(0, args.train_records - have)
    t0 = time.monotonic()
    out: mp.Queue = mp.Queue()
    procs = [mp.Process(target=grow_proc, args=(url, i, wks[i::args.procs],
                                                want // args.procs, out))
             for i in range(args.procs)]
    for p in procs:
        p.start()
    made = sum(out.get() for _ in procs)
    for p in procs:
        p.join()
    commit_s = time.monotonic() - t0
    t1 = time.monotonic()
    moved = 0
    while store.spool_size():
        moved += drain(store, store.archive)
    return {"records": have + made, "made": made, "commit_s": round(commit_s, 1),
            "drained": moved, "drain_s": round(time.monotonic() - t1, 1)}


def train(url: str, archive: str) -> dict:
    """The key's model as workers/round/costmodel.train reads it: samples chosen by their
    entries, then every chosen one read whole (a host with no features cached: the worst
    case) from Redis and, in one pass, the archive; XGBoost on synthetic features."""
    import numpy as np
    from tvm.s_tir.meta_schedule.cost_model import XGBModel

    from farm.store.cold import wholes
    from workers.metaschedule.costmodel import per_workload
    from workers.metaschedule.samples import pick

    store = open_store(url, archive=archive)
    wks = sorted({wk for job in store.job_ids() if job.startswith("live")
                  for wk in (store.get_job(job).workload_keys if store.get_job(job) else [])})
    records = sum(store.record_count(wk) for wk in wks)
    t0 = time.perf_counter()
    picked = pick(store, wks, per_workload(len(wks)), ())
    pick_s = time.perf_counter() - t0
    got = wholes(store, store.archive, DEVICE_KEY, {wk: p.chosen for wk, p in picked.items()})
    read_s = time.perf_counter() - t0
    recs = [r for wk in wks for r in got[wk].values()]
    rng = np.random.default_rng(0)
    xs = [rng.random((3, 164), dtype=np.float32) for _ in recs]
    ys = rng.random(len(recs)).astype("float32")
    t1 = time.perf_counter()
    model = XGBModel(num_tuning_cores=2, verbose_eval=0)
    model._train(xs=xs, ys=ys)  # noqa: SLF001 - as costmodel.train
    return {"records": records, "pick_by_entries_s": round(pick_s, 2),
            "read_s": round(read_s, 2), "samples": len(recs),
            "xgb_train_s": round(time.perf_counter() - t1, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=100)
    ap.add_argument("--phones", type=int, default=10)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--fill", type=int, default=10_000_000)
    ap.add_argument("--workloads", type=int, default=5000)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--train-records", type=int, default=0,
                    help="before training, grow the live jobs' workloads to this many "
                         "records (the archive through the leader's drain); 0: as phase 1 "
                         "left them")
    ap.add_argument("--skip", default="", help="phases to skip: live,sweep,fill,train")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    folder = Path(tempfile.mkdtemp(prefix="fleet-"))
    port = free_port()
    proc = start_redis(folder, port)
    url = f"redis://127.0.0.1:{port}/0"
    archive = str(folder / "archive")
    result: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "cores": os.cpu_count(), "args": {k: str(v) for k, v in vars(args).items()}}
    try:
        if "live" not in skip:
            print(f"live: {args.hosts} hosts x {args.phones} phones at {args.rate}/s for "
                  f"{args.minutes} min", flush=True)
            result["live"] = live(url, archive, args)
            print(f"  {result['live']}", flush=True)
        if "sweep" not in skip:
            result["sweep"] = [sweep(url, n) for n in (1000, 10000)]
            print(f"sweep: {result['sweep']}", flush=True)
        if "train" not in skip and args.train_records:
            result["grow"] = grow(url, archive, args)
            print(f"grow: {result['grow']}", flush=True)
        if "train" not in skip and ("live" not in skip or args.train_records):
            result["train"] = train(url, archive)
            print(f"train: {result['train']}", flush=True)
        if "fill" not in skip:
            print(f"fill: to {args.fill} measurements over {args.workloads} workloads",
                  flush=True)
            filled = fill(url, folder, port, args)
            proc = filled.pop("redis")
            result["fill"] = filled
            print(f"  AOF rewrite {filled['aof_rewrite_s']} s ({filled['aof_bytes']} B), "
                  f"restart {filled['restart_s']} s", flush=True)
    finally:
        proc.terminate()
        proc.wait()
        archive_bytes = sum(f.stat().st_size for f in Path(archive).rglob("*") if f.is_file()) \
            if Path(archive).exists() else 0
        result["archive_bytes"] = archive_bytes
        shutil.rmtree(folder, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
