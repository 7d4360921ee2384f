"""How long a round is lost when a whole worker host is SIGKILLed mid-round, with the default
settings (host TTL 30 s, visibility timeout 1800 s), with and without the farm's supervisor,
side by side in one run.

Each side: its own Redis, two hosts (a tracker, 2 emulated phones and a `farm worker` each),
a small model submitted with --no-wait (no client waits), the host running a round
SIGKILLed (its whole process group), and the time until that round runs again on the other
host. "without" sets FARM_SUPERVISOR_INTERVAL_S so high that the supervisor never sweeps:
the round then comes back only when the broker's visibility timeout restores it, as before
the supervisor existed (about 30 minutes: run it with --sides with,without when you can wait).

    python bench/recovery.py [--sides with,without] [--out bench/recovery.md]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from farm.devices.tracker import wait_for_phones  # noqa: E402
from farm.local import services  # noqa: E402
from farm.store import open_store  # noqa: E402


def model(path: Path) -> Path:
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(96, 48), torch.nn.ReLU(),
                              torch.nn.Linear(48, 12)).eval()
    torch.export.save(torch.export.export(net, (torch.randn(8, 96),)), path)
    return path


def side(work: Path, supervisor: bool) -> dict:
    env = {"FARM_ROUND_TRIALS": "8", "FARM_RUN_TIMEOUT_S": "10"}
    if not supervisor:
        env["FARM_SUPERVISOR_INTERVAL_S"] = "1e9"
    group = services.ServiceGroup()
    try:
        rsvc, url = services.start_redis(work / "redis", work / "logs")
        group.add(rsvc)
        workers, hosts = [], []
        for h in range(2):
            tsvc, tracker = services.start_tracker(work / "logs")
            group.add(tsvc)
            for i in range(2):
                group.add(services.start_phone(tracker, "cpu-local", 10 * h + i, work / "logs"))
            wait_for_phones(tracker, "cpu-local", 2, 60)
            hosts.append(f"farm@bench{h}")
            workers.append(group.add(services.start_worker(
                tracker, url, work / "logs", name=f"worker{h}", env=env,
                extra=["--hostname", hosts[-1]])))
        proc = subprocess.run(
            [sys.executable, "-m", "farm", "submit", str(model(work / "m.pt2")),
             "--trials-per-task", "32", "--no-wait", "--out", str(work / "out"),
             "--wait-for-devices", "120"], capture_output=True, text=True, timeout=600,
            env={**os.environ, "FARM_HOME": str(work / "home"), "FARM_BROKER_URL": url, **env})
        assert proc.returncode == 0, proc.stderr[-2000:]
        job_id = json.loads(proc.stdout)["job_id"]
        store = open_store(url)
        deadline = time.monotonic() + 600
        victim = None
        while victim is None and time.monotonic() < deadline:
            for wk, s in store.task_states(job_id).items():
                if s.state == "tuning" and s.host in hosts and "trials" in s.message:
                    victim = (wk, s.host)
            time.sleep(0.2)
        assert victim is not None, "no round ran"
        wk, host = victim
        workers[hosts.index(host)].signal(signal.SIGKILL)
        killed = time.monotonic()
        other = hosts[1 - hosts.index(host)]
        while time.monotonic() < killed + 2400:
            s = store.task_states(job_id)[wk]
            if s.host == other and s.retries >= 1:
                break
            time.sleep(1)
        else:
            raise AssertionError("the round never came back")
        return {"side": "with supervisor" if supervisor else "without supervisor",
                "recovery_s": round(time.monotonic() - killed, 1)}
    finally:
        group.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sides", default="with,without")
    ap.add_argument("--out", default=str(ROOT / "bench" / "recovery.md"))
    args = ap.parse_args()
    rows = []
    for name in args.sides.split(","):
        with tempfile.TemporaryDirectory(prefix="farm-recovery-") as tmp:
            rows.append(side(Path(tmp), supervisor=name == "with"))
            print(rows[-1], flush=True)
    lines = ["| side | round lost for (s) |", "|---|---|"]
    lines += [f"| {r['side']} | {r['recovery_s']} |" for r in rows]
    if len(rows) == 2:
        lines.append(f"\nratio with/without: {rows[0]['recovery_s'] / rows[1]['recovery_s']:.3f}")
    text = (f"# Recovery after a whole worker SIGKILL ({time.strftime('%Y-%m-%d %H:%M')}, "
            f"{os.cpu_count()} cores; default settings: host TTL 30 s, visibility timeout "
            f"1800 s; bench/recovery.py)\n\n" + "\n".join(lines) + "\n")
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
