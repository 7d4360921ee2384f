"""Workers killed mid-round: the round is redelivered, finished, and nothing is lost or doubled."""

from __future__ import annotations

import signal

import psutil
import pytest

from farm import services
from tests.faults.conftest import record_sets, run_through_fault

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def test_pool_child_killed_mid_round(small_farm, tmp_path):
    def kill_pool_child():
        before = record_sets(small_farm["redis"])
        children = psutil.Process(small_farm["worker"].pid).children()
        assert children, "the worker has no pool child"
        for child in children:  # the prefork pool process running the round
            child.send_signal(signal.SIGKILL)
        return before

    run_through_fault(small_farm, tmp_path, kill_pool_child)


def test_whole_worker_killed_and_another_started(small_farm, tmp_path):
    def kill_worker_start_another():
        small_farm["worker"].signal(signal.SIGKILL)  # the whole worker, pool and all
        small_farm["worker"].stop()
        before = record_sets(small_farm["redis"])
        # a new worker on the same tracker; the lost round comes back (visibility timeout)
        small_farm["worker"] = small_farm["group"].add(services.start_worker(
            small_farm["tracker"], small_farm["redis"], small_farm["logs"], name="worker2",
            env=dict(small_farm["env"]), extra=["--hostname", "farm@faults2"]))
        return before

    run_through_fault(small_farm, tmp_path, kill_worker_start_another)
