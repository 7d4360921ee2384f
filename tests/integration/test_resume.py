"""Stop the submitting client half-way, then `farm resume JOB`: the job continues from the
store under its own id, no candidate is measured twice, and the final log holds the best of all
records. (Submitting the same model again resumes too: test_submit_embedded.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from farm import services
from farm.store import open_store
from tests.helpers import alive, run_farm, started_pids

pytestmark = pytest.mark.integration


def test_interrupted_job_resumes_from_the_store(example_models, tmp_path):
    home = tmp_path / "home"
    model = example_models / "resnet.pt2"
    env = {**os.environ, "FARM_HOME": str(home)}
    env.pop("FARM_BROKER_URL", None)
    args = ["submit", str(model), "--trials-per-task", "8", "--round-trials", "4"]
    first = subprocess.Popen([sys.executable, "-m", "farm.cli", *args, "--out",
                              str(tmp_path / "first")], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        measured = 0
        while time.monotonic() < deadline and measured < 6 and first.poll() is None:
            try:
                url = json.loads((home / "running.json").read_text())["broker_url"]
                store = open_store(url)
                measured = sum(store.record_count(wk) for wk in store.workload_keys())
            except (OSError, ValueError, KeyError, Exception):  # noqa: BLE001 - not up yet
                measured = 0
            time.sleep(1)
        assert measured >= 6, "the first job measured nothing"
        first.send_signal(signal.SIGINT)  # Ctrl-C: the farm stops, the records stay
        _, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 130, err[-2000:]
    assert not (tmp_path / "first").exists()  # nothing half-written
    assert [p for p in started_pids(home) if alive(p[0])] == []

    job_id = err.split("plan: job ")[1].split()[0]
    again = run_farm(["resume", job_id], home)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"job {job_id} resumed (run 2)" in again.stderr
    summary = json.loads((tmp_path / "first" / "summary.json").read_text())  # the job's --out
    assert summary["job_id"] == job_id and summary["run"] == 1
    assert sum(t["trials_from_store"] for t in summary["tasks"]) >= 6  # resumed, not restarted
    assert all(t["state"] in ("done", "exhausted") for t in summary["tasks"])
    assert summary["numerics_ok"]

    svc, url = services.start_redis(home / "redis", tmp_path / "logs")  # read the store
    try:
        store = open_store(url)
        for t in summary["tasks"]:
            records = store.records(t["workload_key"])
            assert len({r.candidate for r in records}) == len(records)
            assert t["trials_from_store"] + t["trials_measured"] == len(records)
            valid = [r.run_us for r in records if r.valid]
            assert t["best_us"] == pytest.approx(min(valid), rel=1e-3, abs=1e-3)  # best of all
    finally:
        svc.stop()
