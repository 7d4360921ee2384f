"""Rounds overlap on a host whose phones are slower than it: one round searches and builds
while another's batch is on the phones; and a fast phone measures more than a slow one (each
session takes a free phone). Real Redis, tracker, two slow phones (they add a fixed delay to
every measurement, like a real phone's upload and run: 1 s and 0.25 s) and one worker with
the automatic gate (workers/round/gate.py): its first round runs alone (nothing is measured yet
and the phones are emulated on its CPU); once the phones' and the host's speeds are
measured, the phones are the slower, and rounds run at once."""

from __future__ import annotations

import json
import re
from datetime import datetime

import pytest

from farm.devices.tracker import phone_address, wait_for_phones
from farm.local import services
from farm.store import open_store
from tests.faults.conftest import wait_until
from tests.helpers import run_farm

pytestmark = pytest.mark.integration
STAMP = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO workers\.round\.(?:measure|tuning): round 1 of (\S+) on "


def round_spans(log: str) -> dict[str, tuple[datetime, datetime]]:
    """task -> (round 1 started, round 1 ended), from the worker's log."""
    starts, ends = {}, {}
    for line in log.splitlines():
        m = re.match(STAMP + r".*: (\d+) trials \(", line)
        if m:
            starts[m.group(2)] = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
        m = re.match(STAMP + r".*new records", line)
        if m:
            ends[m.group(2)] = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
    return {t: (starts[t], ends[t]) for t in starts if t in ends}


def test_two_rounds_at_once_overlap_and_tune_correctly(clean_redis, example_models, tmp_path):
    group = services.ServiceGroup()
    try:
        svc, tracker = services.start_tracker(tmp_path)
        group.add(svc)
        delay = {}  # a slow phone and a fast one: each session asks for a free phone
        for i, d in enumerate((1.0, 0.25)):
            phone = group.add(services.start_phone(tracker, "cpu-local", i, tmp_path,
                                                    services.PhoneOptions(delay_s=d)))
            args = [str(a) for a in phone.popen.args]
            delay[phone_address("127.0.0.1", args[args.index("--port") + 1])] = d
        wait_for_phones(tracker, "cpu-local", 2, 60)
        worker = group.add(services.start_worker(tracker, clean_redis, tmp_path))
        out = tmp_path / "out"
        proc = run_farm(["submit", str(example_models / "resnet.pt2"), "--trials-per-task", "4",
                         "--out", str(out), "--tracker", tracker, "--timeout", "900",
                         "--wait-for-devices", "120"],  # the worker's first heartbeat
                        tmp_path, env={"FARM_BROKER_URL": clean_redis})
        assert proc.returncode == 0, proc.stderr[-3000:] + worker.log_tail()
        summary = json.loads((out / "summary.json").read_text())
        log = (tmp_path / "worker.log").read_text()
        spans = round_spans(log)
        # the host says how many cores its phones need of it, from its rounds' CPU account
        hosts = wait_until("a heartbeat with the cores the phones need", lambda: [
            h for h in open_store(clean_redis).hosts() if h.cores_needed], timeout_s=60)
    finally:
        group.stop()
    assert len(spans) == len(summary["tasks"]) >= 3, spans
    ordered = sorted(spans.values())
    overlaps = sum(1 for (_, end), (start, _) in zip(ordered, ordered[1:], strict=False) if start < end)
    assert overlaps >= 1, spans  # a round started while the one before was still running
    decided = re.findall(r"(\d) round\(s\) at once: (.*)", log)
    assert decided[0][0] == "1" and any(int(n) >= 2 and "phones measure a batch" in why
                                        for n, why in decided), decided
    assert 0 < summary["phone_utilization"] <= 1
    by_delay = {delay[p["phone"]]: p for p in summary["phones"]}
    assert by_delay[0.25]["measurements"] > by_delay[1.0]["measurements"], by_delay  # pulled
    assert by_delay[1.0]["mean_ms"] > by_delay[0.25]["mean_ms"] + 500, by_delay
    store = open_store(clean_redis)
    for task in summary["tasks"]:  # and nothing was measured twice or lost
        recs = store.records(task["workload_key"])
        assert len(recs) == task["trials_measured"] >= 1
        assert task["counts"]["duplicates"] == 0, task["counts"]  # counted by the store
        assert task["counts"]["new"] == task["trials_measured"], task["counts"]
        assert task["measure_s"] > 0
    assert summary["numerics_ok"]
    from farm.core.cores import usable_cores

    (host,) = hosts
    assert host.cores == usable_cores() and set(host.cores_needed) == {"cpu-local"}
    assert 0 < host.cores_needed["cpu-local"], host

