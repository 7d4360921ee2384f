"""farm doctor against real parts: Redis, a tracker, a phone that runs a kernel."""

from __future__ import annotations

import pytest

from farm.devices.tracker import wait_for_phones
from farm.local import services
from tests.helpers import run_farm

pytestmark = pytest.mark.integration


@pytest.fixture
def one_phone(tmp_path):
    group = services.ServiceGroup()
    try:
        svc, tracker = services.start_tracker(tmp_path)
        group.add(svc)
        group.add(services.start_phone(tracker, "doc-key", 0, tmp_path))
        wait_for_phones(tracker, "doc-key", 1, 60)
        yield tracker
    finally:
        group.stop()


def test_doctor_passes_with_a_phone_that_runs_a_kernel(one_phone, redis_url, tmp_path):
    proc = run_farm(["doctor", "--tracker", one_phone, "--device-key", "doc-key",
                     "--broker", redis_url], tmp_path, timeout_s=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[pass] Redis (store and broker)" in proc.stdout
    assert "[pass] phones of key doc-key: 1 phone(s)" in proc.stdout
    assert "[pass] a kernel on a phone: a kernel built, uploaded and ran correctly" in proc.stdout


def test_doctor_names_what_is_missing_and_the_fix(one_phone, tmp_path):
    dead = f"redis://127.0.0.1:{services.free_port()}/0"
    proc = run_farm(["doctor", "--tracker", one_phone, "--device-key", "nokey", "--broker", dead],
                    tmp_path, timeout_s=300)
    assert proc.returncode == 5
    assert "[FAIL] Redis (store and broker)" in proc.stdout and "redis-cli" in proc.stdout
    assert "[FAIL] phones of key nokey" in proc.stdout and "doc-key" in proc.stdout
    assert "fix: start phones" in proc.stdout
