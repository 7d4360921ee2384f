"""A whole worker host SIGKILLed mid-round on a two-host farm, with the default visibility
timeout (1800 s) and the fault farms' short host TTL (tests/faults/conftest.py FAULT_ENV): the
farm's supervisor sends the lost round to the other host within a host TTL and a sweep, not
after the visibility timeout."""

from __future__ import annotations

import json
import time

import pytest

from farm.core.config import FarmConfig
from tests.faults.conftest import Farm, check_store, start_submit, tiny_model, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.faults]


@pytest.fixture(scope="module")
def farm2(tmp_path_factory):
    farm = Farm(tmp_path_factory.mktemp("farm2"), hosts=2)
    try:
        yield farm
    finally:
        farm.stop()


def test_a_killed_host_costs_seconds_not_the_visibility_timeout(farm2, tmp_path):
    ttl_s = int(farm2.env["FARM_HOST_TTL_S"])
    # the visibility timeout is the default: the round must not wait for it
    assert "FARM_ROUND_TIMEOUT_S" not in farm2.env and FarmConfig().round_timeout_s == 1800
    model = tiny_model(tmp_path / "tiny.pt2", width=60)
    proc = start_submit(farm2, model, tmp_path / "out", tmp_path / "home", trials=8)
    store = farm2.store()
    try:
        def running() -> tuple[str, str] | None:
            for j in store.job_ids():
                for wk, s in store.task_states(j).items():
                    if s.state == "tuning" and s.host:
                        return j, wk
            return None

        job_id, wk = wait_until("a round running", running, timeout_s=300, every_s=0.2)
        victim = [farm2.host(h) for h in (0, 1)].index(store.task_states(job_id)[wk].host)
        killed_at = time.monotonic()
        farm2.workers[victim].signal(9)  # SIGKILL, the whole process group: pool and builders
        other = farm2.host(1 - victim)

        def back_on_the_other_host() -> bool:
            s = store.task_states(job_id)[wk]
            retries = store.job_counts(job_id).get(wk, {}).get("retries", 0)
            return s.terminal or (s.host == other and retries >= 1)

        wait_until("the lost round running again", back_on_the_other_host, timeout_s=600)
        recovered_s = time.monotonic() - killed_at
        print(f"\nwhole worker SIGKILL: its round ran again on {other} after {recovered_s:.0f} s "
              f"(host TTL {ttl_s} s; visibility timeout 1800 s)")
        _, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    # a host TTL for the lease to expire, a TTL of grace, a sweep, and the round's start
    assert recovered_s < 3 * ttl_s + 30, recovered_s
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    task = next(t for t in summary["tasks"] if t["workload_key"] == wk)
    assert task["retries"] >= 1, task
    check_store(farm2, summary)
