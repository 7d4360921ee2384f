"""Phones that freeze or die mid-job: the job completes, and a lost phone is never recorded
as a failed kernel (README: "What happens when things fail")."""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.faults.conftest import check_store, record_sets, run_through_fault, submit, tiny_model

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def test_a_frozen_phone_is_device_lost_not_a_failed_kernel(small_farm, tmp_path):
    model = tiny_model(tmp_path / "tiny.pt2")
    small_farm["phones"][0].signal(signal.SIGSTOP)  # frozen: registered, never answers
    out = tmp_path / "out"
    proc = submit(small_farm, model, out, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:] + small_farm["worker"].log_tail(30)
    summary = json.loads((out / "summary.json").read_text())
    assert sum(t["device_lost"] for t in summary["tasks"]) >= 1, summary["tasks"]
    assert summary["numerics_ok"]
    check_store(small_farm, summary)


def test_a_phone_killed_mid_job(small_farm, tmp_path):
    def kill_phone():
        before = record_sets(small_farm["redis"])
        small_farm["phones"][1].stop()
        return before

    run_through_fault(small_farm, tmp_path, kill_phone)


def test_all_phones_gone_then_one_back(small_farm, tmp_path):
    def remove_phones_then_bring_one_back():
        from farm import services
        from farm.store import open_store
        from farm.tracker import wait_for_phones

        before = record_sets(small_farm["redis"])
        for phone in small_farm["phones"]:
            phone.stop()
        store = open_store(small_farm["redis"])
        deadline = time.monotonic() + 120
        seen = ""
        while time.monotonic() < deadline and "waiting for a phone" not in seen:
            seen = " ".join(s.message for j in store.job_ids()
                            for s in store.task_states(j).values())
            time.sleep(0.5)
        assert "waiting for a phone of key cpu-local on host farm@faults" in seen, seen
        small_farm["group"].add(services.start_phone(small_farm["tracker"], "cpu-local", 9,
                                                     small_farm["logs"]))
        wait_for_phones(small_farm["tracker"], "cpu-local", 1, 60)
        return before

    run_through_fault(small_farm, tmp_path, remove_phones_then_bring_one_back, trials=16)
