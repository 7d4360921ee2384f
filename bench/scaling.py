"""Scaling: more phones and more worker hosts make jobs faster; every phone stays busy.

    python bench/scaling.py [--phones 1,2,4,8] [--delay-s 1.0] [--trials 16] [--layers 12]
                            [--out bench]

Every configuration is a lab farm of its own on loopback (a fresh Redis, per host a tracker,
its emulated phones and a `farm worker` with the automatic gate), waited for until its workers
are warm, then one `farm submit` of the same model (a stack of `--layers` dense layers of
different widths: one tuning task each), `--trials` trials per task, one round per task
(`--round-trials` less: more rounds).
Phones are slow emulated phones (farm/devices/phone.py): each measurement session sleeps
`--delay-s`, like a real phone's upload and run, and runs its kernel briefly
(`--min-repeat-ms`, default 0), so that it uses little host CPU. They stand for real
phones, so their device key (`slow-phone`, a farm.toml the bench writes) is not `host_cpu`:
the worker treats them as devices of their own (search threads, gate).

Configurations, one after another (never two at once):
- 1, 2, 4, 8 phones on one host;
- 1 host with 2 phones vs 2 hosts with 2 phones each (each host its own tracker and worker),
  the 2 hosts once with hand-off at a job's tail (workers/round/handoff.py) and once without;
- a mix on one host: 2 phones at `--delay-s` and 2 at a quarter of it.
- helper: one phone host pinned to one CPU (tracker, phones, worker), with 1 phone, and with
  `--helper-phones` (8, 16) phones three ways: its rounds' search one after another with
  measuring (FARM_SEARCH_AHEAD=0, the farm before 2026-12-05), a batch ahead (the default),
  and a batch ahead with a helper host (`farm worker --helper`) pinned to the other CPU, to
  which the phone host lends its search and builds (lend_search auto: 8 phones on 1 core
  are short of cores). Efficiency is against the section's 1-phone run.

Per configuration: job trials/min over the tuning phase (first round sent -> last task done,
summary.json's tuning_s), phone utilization (summary.json: busy / tuning wall, mean over the
phones), job efficiency = rate(n) / (n x rate(1)); pinned, each CPU's busy share over the
job's submit (host 0 on the first CPU, the helper on the next; the submit's own import and
compile float over both) and the helper's CPU seconds per measured trial (its CPU's busy
share x the submit's wall / trials): what one helper core can feed. Writes
<out>/scaling.json and scaling.md.
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KEY = "slow-phone"


def slow_phone_profile(work: Path, min_repeat_ms: int = 0) -> Path:
    """The bench's phones stand for real slow phones: a device key of their own whose
    profile is not `host_cpu` (a real phone's measurement takes none of the host's cores, so
    the worker's rules for devices of their own apply: workers/round/gate.py, measure.py), with
    this CPU as the target (the emulated phones run its code). Their evaluator runs a kernel
    `min_repeat_ms` at least (default 0: a few runs; the sleep stands for the phone's upload
    and run): at the profiles' default of 100 each measurement ran its kernel 0.1 s or more on
    the emulated phone, i.e. on the phone host's CPU, work a real phone host never does.
    Returns the farm.toml."""
    from farm.devices.hostcpu import system_cpu

    cpu = system_cpu()
    mcpu = f', mcpu = "{cpu}"' if cpu else ""
    path = work / "farm.toml"
    path.write_text(f'[profiles.{KEY}]\ntarget = {{ kind = "llvm"{mcpu} }}\nhost_cpu = false\n'
                    f'min_repeat_ms = {min_repeat_ms}\n'
                    'notes = "bench/scaling.py: slow emulated phones"\n')
    return path


def make_model(path: Path, layers: int, base: int = 48) -> Path:
    import torch

    torch.manual_seed(0)
    widths = [base + 8 * i for i in range(layers + 1)]  # every layer a workload of its own
    parts: list[torch.nn.Module] = []
    for a, b in zip(widths, widths[1:], strict=False):
        parts += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    net = torch.nn.Sequential(*parts).eval()
    torch.export.save(torch.export.export(net, (torch.randn(4, widths[0]),)), path)
    return path


def wait_warm(worker_log: Path, processes: int, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = worker_log.read_text(errors="replace") if worker_log.exists() else ""
        if text.count(": warm in ") >= processes:  # a gated worker warms one process
            return
        time.sleep(1)
    raise SystemExit(f"workers not warm within {timeout_s:.0f} s: {worker_log}")


def cpu_busy(before: list[Any], after: list[Any]) -> list[float]:
    """Each CPU's busy fraction between two psutil.cpu_times(percpu=True) readings."""
    out = []
    for a, b in zip(before, after, strict=True):
        total = sum(b) - sum(a)
        idle = (b.idle + getattr(b, "iowait", 0)) - (a.idle + getattr(a, "iowait", 0))
        out.append(round(1 - idle / total, 3) if total > 0 else 0.0)
    return out


def submit(model: Path, trials: int, out: Path, tracker: str, url: str, root: Path,
           round_trials: int = 0) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "farm", "submit", str(model), "--trials-per-task", str(trials),
         "--round-trials", str(round_trials or trials), "--out", str(out), "--tracker", tracker,
         "--device-key", KEY,
         "--timeout", "3600", "--wait-for-devices", "120"],
        capture_output=True, text=True,
        env={**os.environ, "FARM_HOME": str(root / "home"), "FARM_BROKER_URL": url})
    if proc.returncode != 0:
        raise SystemExit(f"{root.name}: farm submit failed:\n{proc.stderr[-3000:]}")


def run_config(name: str, hosts: list[list[float]], model: Path, warm_up: Path, trials: int,
               work: Path, pin: bool = False, handoff: bool = True,
               keep: Path | None = None, helper: bool = False,
               env: dict[str, str] | None = None, round_trials: int = 0) -> dict[str, Any]:
    """One lab farm (hosts: each a list of its phones' delays), one job; its numbers. With
    `pin`, host h's tracker, phones and worker (and the processes they start) run on CPU h
    only: each emulated host is a 1-core machine of its own. With `helper`, a helper host
    (`farm worker --helper`, no phones) too, pinned to the CPU after the hosts'. `env`: the
    workers' settings."""
    import psutil

    from farm.devices.tracker import phone_address, wait_for_phones
    from farm.local import services
    root = work / name
    delay_of: dict[str, float] = {}
    logs = root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    group = services.ServiceGroup()
    try:
        redis_svc, url = services.start_redis(root / "redis", logs)
        group.add(redis_svc)
        trackers = []
        cpus = sorted(os.sched_getaffinity(0))  # host h runs on cpus[h] when pinned
        for h, delays in enumerate(hosts):
            tsvc, tracker = services.start_tracker(logs)
            group.add(tsvc)
            cpu = {cpus[h % len(cpus)]}
            if pin:
                os.sched_setaffinity(tsvc.pid, cpu)
            trackers.append(tracker)
            for i, d in enumerate(delays):
                phone = group.add(services.start_phone(tracker, KEY, 10 * h + i, logs,
                                                       services.PhoneOptions(delay_s=d)))
                if pin:
                    os.sched_setaffinity(phone.pid, cpu)
                args = [str(a) for a in phone.popen.args]  # type: ignore[union-attr]
                delay_of[phone_address("127.0.0.1", args[args.index("--port") + 1])] = d
            wait_for_phones(tracker, KEY, len(delays), 60)
            worker = group.add(services.start_worker(
                tracker, url, logs, name=f"worker{h}", extra=["--hostname", f"farm@host{h}"],
                env={"FARM_ROUND_HANDOFF": "1" if handoff else "0", **(env or {})}))
            if pin:  # at once: its pool processes and their helpers inherit it
                os.sched_setaffinity(worker.pid, cpu)
        if helper:
            svc = group.add(services.start_helper(url, logs, name="helper",
                                                  extra=["--hostname", "farm@helper"],
                                                  env=env))
            if pin:
                os.sched_setaffinity(svc.pid, {cpus[len(hosts) % len(cpus)]})
            wait_warm(logs / "helper.log", 1)
        for h in range(len(hosts)):
            wait_warm(logs / f"worker{h}.log", 1)
        # a lab worker has run rounds before: a small warm-up job of other workloads warms
        # the pool processes the gate opens (each pays TVM's first-round costs once)
        submit(warm_up, 4, root / "warm-up", trackers[0], url, root)
        out = root / "out"
        t0, cpu0 = time.monotonic(), psutil.cpu_times(percpu=True)
        submit(model, trials, out, trackers[0], url, root, round_trials)
        wall, busy = time.monotonic() - t0, cpu_busy(cpu0, psutil.cpu_times(percpu=True))
    finally:
        group.stop()
        if keep is not None:  # the logs and the job's outputs, for a look at the timeline
            shutil.copytree(root, keep / name, ignore=shutil.ignore_patterns("redis", "*.so"),
                            dirs_exist_ok=True)
    s = json.loads((out / "summary.json").read_text())
    trials_done = sum(t["trials_measured"] for t in s["tasks"])
    return {"config": name, "hosts": len(hosts), "phones": sum(len(d) for d in hosts),
            "helper": helper, "searched_by_helper": sum(1 for t in s["tasks"]
                                                        if t.get("searched_by")),
            "tasks": len(s["tasks"]), "trials": trials_done,
            "tuning_s": round(s["tuning_s"], 1), "wall_s": round(wall, 1),
            "job_trials_per_min": round(trials_done / s["tuning_s"] * 60, 1),
            "phone_utilization": s["phone_utilization"],
            # pinned: each CPU's busy share over the job's submit (import and compile too),
            # host h on cpus[h], the helper on the next
            "cpu_busy": [busy[c] for c in cpus[:len(hosts) + helper]] if pin else None,
            "helper_cpu_s_per_trial": round(busy[cpus[len(hosts)]] * wall / max(1, trials_done),
                                            3) if pin and helper else None,
            "per_phone": [{"phone": p["phone"], "worker": p["worker"],
                           "delay_s": delay_of.get(p["phone"]),
                           "measurements": p["measurements"],
                           "utilization": p["utilization"], "mean_ms": p["mean_ms"]}
                          for p in s["phones"]]}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--phones", default="1,2,4,8")
    p.add_argument("--delay-s", type=float, default=1.0)
    p.add_argument("--trials", type=int, default=16)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--round-trials", type=int, default=0,
                   help="trials of a round (default: --trials, one round per task)")
    p.add_argument("--out", default=str(ROOT / "bench"))
    p.add_argument("--skip", default="",
                   help="sections to skip: phones,hosts,mix,helper; one-host: the hosts "
                        "section without its 1-host run; helper-base: the helper section "
                        "without its 1-phone run (no efficiency then)")
    p.add_argument("--helper-phones", default="8,16",
                   help="the helper section: phones of the one phone host (pinned to one "
                        "CPU), alone and with a helper host pinned to the other")
    p.add_argument("--helper-modes", default="serial,ahead,helper",
                   help="the helper section's runs at each phone count: search serial, a "
                        "batch ahead, a batch ahead with the helper host")
    p.add_argument("--keep", default="",
                   help="copy each configuration's logs and job outputs under this directory")
    p.add_argument("--min-repeat-ms", type=int, default=0,
                   help="the phones' evaluator: each measurement runs its kernel this long at "
                        "least, on the emulated phone (this machine's CPU); 100 is the "
                        "profiles' default (the runs before 2026-12-06 06:00)")
    p.add_argument("--pin", action="store_true",
                   help="each emulated host (tracker, phones, worker) on one CPU of its own: "
                        "1 host vs 2 hosts is then 1 core vs 2, as separate machines would be")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    d = args.delay_s
    with tempfile.TemporaryDirectory(prefix="farm-scaling-") as tmp:
        work = Path(tmp)
        # the workers' and the submits' profiles
        os.environ["FARM_CONFIG"] = str(slow_phone_profile(work, args.min_repeat_ms))
        model = make_model(work / "stack.pt2", args.layers)
        warm_up = make_model(work / "warm-up.pt2", 8, base=20)
        rows: list[dict[str, Any]] = []
        configs: list[tuple[str, str, list[list[float]]]] = []
        skip = set(args.skip.split(","))
        if "phones" not in skip:
            configs += [("phones", f"{n} phones", [[d] * n])
                        for n in map(int, args.phones.split(","))]
        if "hosts" not in skip:
            configs += [("hosts", "1 host x 2 phones", [[d, d]])] * ("one-host" not in skip)
            configs += [("hosts", "2 hosts x 2 phones", [[d, d], [d, d]]),
                        ("hosts", "2 hosts x 2 phones, no hand-off", [[d, d], [d, d]])]
        if "mix" not in skip:
            configs += [("mix", "2 slow + 2 fast phones", [[d, d, d / 4, d / 4]])]
        if "helper" not in skip:
            configs += [("helper", "1 phone, pinned", [[d]])] * ("helper-base" not in skip)
            modes = {"serial": ", search serial", "ahead": "", "helper": ", + helper"}
            for n in map(int, args.helper_phones.split(",")):
                configs += [("helper", f"{n} phones, pinned{modes[m]}", [[d] * n])
                            for m in args.helper_modes.split(",")]
        for section, name, hosts in configs:
            serial = "search serial" in name
            row = {"section": section, **run_config(
                name.replace(" ", "-").replace(",", "").replace("+", "plus"), hosts, model,
                warm_up, args.trials, work, args.pin or section == "helper",
                handoff="no hand-off" not in name, keep=Path(args.keep) if args.keep else None,
                helper="+ helper" in name,
                env={"FARM_SEARCH_AHEAD": "0" if serial else "1"},
                round_trials=args.round_trials)}
            row["config"] = name
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "per_phone"}), flush=True)
    base = {sec: next((r for r in rows if r["section"] == sec), None) for sec in ("phones",
                                                                              "hosts", "helper")}
    for r in rows:
        b = base.get(r["section"])
        if b is not None:
            unit = b["job_trials_per_min"] / b["phones"]
            r["job_efficiency"] = round(r["job_trials_per_min"] / (r["phones"] * unit), 3)
            r["speedup"] = round(r["job_trials_per_min"] / b["job_trials_per_min"], 2)
    meta = {"date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or
            platform.machine(), "cores": os.cpu_count(), "delay_s": d, "trials_per_task":
            args.trials, "layers": args.layers, "pinned": args.pin}
    (out / "scaling.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = [f"# Scaling ({meta['date']}, {meta['cores']} cores, phones sleeping {d} s a "
             f"measurement, {args.layers} tasks x {args.trials} trials"
             f"{', each host pinned to one CPU' if args.pin else ''})", "", __doc__.split(
                 "\n\n", 1)[1].strip(), "",
             "| section | config | phones | trials | tuning s | job trials/min | speed-up | "
             "job efficiency | phone utilization | CPU busy (pinned: hosts, helper) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cpus = " / ".join(map(str, r["cpu_busy"])) if r.get("cpu_busy") else "-"
        if r.get("helper_cpu_s_per_trial"):
            cpus += f" (helper {r['helper_cpu_s_per_trial']} s a trial)"
        lines.append(f"| {r['section']} | {r['config']} | {r['phones']} | {r['trials']} | "
                     f"{r['tuning_s']} | {r['job_trials_per_min']} | {r.get('speedup', '-')} | "
                     f"{r.get('job_efficiency', '-')} | {r['phone_utilization']} | {cpus} |")
    for r in rows:
        if r["section"] == "mix":
            lines += ["", f"Mix ({r['config']}): measurements per phone", ""]
            lines += [f"- {p['phone']} (sleeps {p['delay_s']} s): {p['measurements']} "
                      f"measurements, mean {p['mean_ms']} "
                      f"ms, utilization {p['utilization']}" for p in r["per_phone"]]
    (out / "scaling.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
