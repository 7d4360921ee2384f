"""Workers killed mid-round: the round is redelivered, finished, and nothing is lost or doubled."""

from __future__ import annotations

import json
import signal

import psutil
import pytest

from farm import services
from tests.faults.conftest import (
    check_store,
    record_sets,
    start_submit,
    tiny_model,
    wait_for_records,
)

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def finish(proc, farm) -> str:
    try:
        _, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:] + farm["worker"].log_tail(40)
    return err


def assert_kept(before: dict, after: dict) -> None:
    for k, cands in before.items():
        assert cands <= after[k], "a record measured before the fault was lost"


def test_pool_child_killed_mid_round(small_farm, tmp_path):
    model = tiny_model(tmp_path / "tiny.pt2")
    out = tmp_path / "out"
    proc = start_submit(small_farm, model, out, tmp_path / "home", trials=12)
    wait_for_records(small_farm["redis"])
    before = record_sets(small_farm["redis"])
    children = psutil.Process(small_farm["worker"].pid).children()
    assert children, "the worker has no pool child"
    for child in children:  # the prefork pool process running the round
        child.send_signal(signal.SIGKILL)
    finish(proc, small_farm)
    assert_kept(before, record_sets(small_farm["redis"]))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["numerics_ok"]
    check_store(small_farm, summary)


def test_whole_worker_killed_and_another_started(small_farm, tmp_path):
    model = tiny_model(tmp_path / "tiny.pt2")
    out = tmp_path / "out"
    proc = start_submit(small_farm, model, out, tmp_path / "home", trials=12)
    wait_for_records(small_farm["redis"])
    small_farm["worker"].signal(signal.SIGKILL)  # the whole worker, pool and all
    small_farm["worker"].stop()
    before = record_sets(small_farm["redis"])
    # a new worker on the same tracker; the lost round comes back after the visibility timeout
    small_farm["worker"] = services.start_worker(
        small_farm["tracker"], small_farm["redis"], small_farm["logs"], name="worker2",
        env=dict(small_farm["env"]), extra=["--hostname", "farm@faults2"])
    small_farm["group"].add(small_farm["worker"])
    finish(proc, small_farm)
    assert_kept(before, record_sets(small_farm["redis"]))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["numerics_ok"]
    check_store(small_farm, summary)
