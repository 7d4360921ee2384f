"""Phones that cannot run the candidates: the job fails with the phone's own words, never an
exit 0 with an untuned model, and `farm doctor` says the same before any job.

The phones are this machine's runtime-only phones; the key's profile (a farm.toml a user got
wrong) builds aarch64 code for them, cross-linked as for a board. Every candidate is linked
here and uploaded, and every load on the phone fails: what the issue's user saw as
`failures: {runtime: 2}`, an exit 0 and "numerics match torch"."""

from __future__ import annotations

import json
import time

import pytest

from farm.core.errors import UnmeasuredError
from farm.devices.tracker import wait_for_phones
from farm.local import services
from farm.store import open_store
from tests.helpers import redis_and_tracker, run_farm

pytestmark = pytest.mark.integration

KEY = "board-x86"
TOML = f"""[profiles.{KEY}]
target = {{ kind = "llvm", mtriple = "aarch64-linux-gnu" }}
export = "cross"
cc = "aarch64-linux-gnu-g++"
host_cpu = false
min_repeat_ms = 0
"""


@pytest.fixture(scope="module")
def wrong_key(tmp_path_factory):
    """A lab farm of one host (its own Redis, a tracker, a worker) with one runtime-only x86
    phone registered under KEY; the farm.toml; the broker URL."""
    logs = tmp_path_factory.mktemp("unmeasured")
    toml = logs / "farm.toml"
    toml.write_text(TOML)
    with redis_and_tracker(logs) as (group, broker, tracker):
        group.add(services.start_phone(tracker, KEY, 0, logs))
        wait_for_phones(tracker, KEY, 1, 60)
        worker = group.add(services.start_worker(tracker, broker, logs,
                                                 env={"FARM_CONFIG": str(toml)}))
        store = open_store(broker)
        deadline = time.monotonic() + 120
        while not store.hosts():  # the worker's first heartbeat: it serves the key
            assert worker.alive() and time.monotonic() < deadline, worker.log_tail()
            time.sleep(0.5)
        store.close()
        yield tracker, toml, broker


def test_doctor_fails_with_the_phones_own_error(wrong_key, tmp_path):
    tracker, toml, _ = wrong_key
    proc = run_farm(["doctor", "--tracker", tracker, "--device-key", KEY], tmp_path,
                    timeout_s=300, env={"FARM_CONFIG": str(toml)})
    assert proc.returncode == 5, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines()
                if x.startswith("[FAIL] a candidate on a phone: "))
    assert "upload and load on 127.0.0.1:" in line, line
    assert "ELF" in line or "cannot open shared object" in line, line  # the phone's dlopen


def test_a_job_that_measured_nothing_valid_fails_with_the_phones_error(wrong_key, tmp_path):
    import torch

    tracker, toml, broker = wrong_key
    model = tmp_path / "fc.pt2"
    torch.export.save(torch.export.export(torch.nn.Sequential(
        torch.nn.Linear(16, 8), torch.nn.ReLU()).eval(), (torch.randn(2, 16),)), model)
    home = tmp_path / "home"
    env = {"FARM_CONFIG": str(toml), "FARM_BROKER_URL": broker}
    # --tracker: the tuned model of an aarch64 profile runs on a phone, never on this machine
    proc = run_farm(["submit", str(model), "--device-key", KEY, "--trials-per-task", "2",
                     "--tracker", tracker, "--out", str(tmp_path / "out")], home,
                    timeout_s=900, env=env)
    err = proc.stderr
    assert proc.returncode == UnmeasuredError.exit_code, proc.stdout[-2000:] + err[-3000:]
    assert "no task got one valid measurement" in err, err[-2000:]
    assert "ELF" in err or "cannot open shared object" in err, err[-2000:]
    assert "fix: the phone cannot load the library built for it" in err, err[-2000:]
    assert not (tmp_path / "out").exists()  # no untuned model handed out as a result
    # the store says the same: the job failed, each task keeps the phone's first error
    status = run_farm(["status", "--json"], home, timeout_s=120, env=env)
    assert status.returncode == 0, status.stderr
    jobs = json.loads(status.stdout)
    view = jobs[0] if isinstance(jobs, list) else jobs
    assert view["status"]["state"] == "failed", view["status"]
    errors = [t["errors"] for t in view["tasks"] if t["errors"]]
    assert errors and all("runtime" in e for e in errors), view["tasks"]
