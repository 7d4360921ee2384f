"""Phones that freeze or die mid-job: the job completes, a lost phone is never recorded as a
failed kernel, and its measurement is counted as device_lost (README: "What happens when
things fail"). The tests share one farm; each puts back the phones it broke."""

from __future__ import annotations

import json
import signal
import time

import pytest

from farm.devices.tracker import wait_for_phones
from farm.local import services
from tests.faults.conftest import (
    check_store,
    phone_addr,
    run_through_fault,
    submit,
    tiny_model,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def test_a_frozen_phone_is_device_lost_not_a_failed_kernel(healthy, tmp_path):
    model = tiny_model(tmp_path / "tiny.pt2", width=40)
    frozen = phone_addr(healthy.phones[0][0])
    healthy.phones[0][0].signal(signal.SIGSTOP)  # frozen: registered, never answers
    t0 = time.monotonic()
    out = tmp_path / "out"
    proc = submit(healthy, model, out, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:] + healthy.worker.log_tail(30)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["measurements"]["device_lost"] >= 1, summary["measurements"]
    assert sum(t["device_lost"] for t in summary["tasks"]) >= 1, summary["tasks"]
    phones = {p["phone"]: p for p in summary["phones"]}  # the frozen one, named
    assert phones[frozen]["device_lost"] >= 1, phones
    other = [p for a, p in phones.items() if a != frozen]
    assert other and all(p["device_lost"] == 0 and p["measurements"] > 0 for p in other), phones
    assert healthy.store().phone_stats() and any(
        s.phone == frozen and s.device_lost >= 1 for s in healthy.store().phone_stats())
    print(f"\njob with a frozen phone: {time.monotonic() - t0:.0f} s, "
          f"measurements {summary['measurements']}")
    check_store(healthy, summary)


def test_a_phone_killed_mid_job(healthy, tmp_path):
    def kill_phone():
        healthy.phones[0][1].stop()

    run_through_fault(healthy, tmp_path, kill_phone, width=44)


def test_all_phones_gone_then_one_back(healthy, tmp_path):
    def remove_phones_then_bring_one_back():
        for phone in healthy.phones[0]:
            phone.stop()
        store = healthy.store()

        def waiting() -> bool:
            return any("waiting for a phone of key cpu-local on host farm@host0" in s.message
                       for j in store.job_ids() for s in store.task_states(j).values())

        wait_until("a round waiting for a phone", waiting, timeout_s=120)
        healthy.phones[0][0] = healthy.group.add(services.start_phone(
            healthy.tracker, "cpu-local", 9, healthy.logs))
        wait_for_phones(healthy.tracker, "cpu-local", 1, 60)

    run_through_fault(healthy, tmp_path, remove_phones_then_bring_one_back, trials=16, width=48)
