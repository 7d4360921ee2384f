"""farm doctor against real parts: Redis, a tracker, a phone that runs a kernel."""

from __future__ import annotations

import pytest

from farm.devices.tracker import wait_for_phones
from farm.local import services
from tests.helpers import run_farm

pytestmark = pytest.mark.integration


def start_one_phone(tmp_path, key: str):
    group = services.ServiceGroup()
    svc, tracker = services.start_tracker(tmp_path)
    group.add(svc)
    group.add(services.start_phone(tracker, key, 0, tmp_path))
    wait_for_phones(tracker, key, 1, 60)
    return group, tracker


@pytest.fixture
def one_phone(tmp_path):
    group, tracker = start_one_phone(tmp_path, "doc-key")
    try:
        yield tracker
    finally:
        group.stop()


def test_doctor_passes_with_a_phone_that_runs_a_kernel(one_phone, redis_url, tmp_path):
    proc = run_farm(["doctor", "--tracker", one_phone, "--device-key", "doc-key",
                     "--broker", redis_url], tmp_path, timeout_s=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[pass] Redis (store and broker)" in proc.stdout
    assert "[pass] phones of key doc-key: 1 phone(s)" in proc.stdout
    assert "[pass] a candidate on a phone: a candidate built and linked here, uploaded, loaded, run and checked" in proc.stdout
    # the phone said its CPU (this machine's): the key's profile, like cpu-local, is made for it
    from farm.devices.hostcpu import system_cpu

    line = next(x for x in proc.stdout.splitlines() if x.startswith("[pass] the phone's CPU: "))
    assert line.startswith(f"[pass] the phone's CPU: {system_cpu() or 'generic'} (x86_64"), line
    made = line.split("profiles made for it: ", 1)[1].split(";")[0].split(", ")
    assert {"cpu-local", "doc-key"} <= set(made) and "android-arm64" not in line, line


def test_doctor_says_a_profile_does_not_fit_the_phone_and_names_those_that_do(tmp_path):
    """Phones of this machine registered under an arm64 phone's key: the profile would build
    aarch64 code for an x86 CPU. Doctor says so before any kernel runs, and names cpu-local."""
    group, tracker = start_one_phone(tmp_path, "android-cortex-a76")
    try:
        proc = run_farm(["doctor", "--tracker", tracker, "--device-key", "android-cortex-a76"],
                        tmp_path, timeout_s=300, env={"TVM_NDK_CC": "g++"})
    finally:
        group.stop()
    assert proc.returncode == 5, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("[FAIL] the phone's CPU: "))
    assert "(x86_64" in line and "profile android-cortex-a76 builds code it cannot run" in line
    assert "profiles made for it: cpu-local" in line, line
    assert "fix: use the device key of a profile made for that CPU" in proc.stdout


def test_doctor_names_what_is_missing_and_the_fix(one_phone, tmp_path):
    dead = f"redis://127.0.0.1:{services.free_port()}/0"
    proc = run_farm(["doctor", "--tracker", one_phone, "--device-key", "nokey", "--broker", dead],
                    tmp_path, timeout_s=300)
    assert proc.returncode == 5
    assert "[FAIL] Redis (store and broker)" in proc.stdout and "redis-cli" in proc.stdout
    assert "[FAIL] phones of key nokey" in proc.stdout and "doc-key" in proc.stdout
    assert "fix: start phones" in proc.stdout


def test_doctor_warns_when_the_store_fills_within_a_week(tmp_path):
    """A store at this hour's rate fills its maxmemory in under 7 days: doctor says when and
    what to do, as a warning (the farm still works: exit 0)."""
    import time

    from farm.core.messages import TuneTask
    from farm.store import StoredRecord, open_store

    svc, url = services.start_redis(tmp_path / "redis", tmp_path, maxmemory="8mb")
    try:
        store = open_store(url)
        store.put_workload(TuneTask(name="w", workload_key="w", weight=1, mod_json="{}",
                                    target={"kind": "llvm"}, device_key="k"))
        for i in range(300):  # 300 measurements in the last minute, ~4 KB each
            store.add_record(StoredRecord(workload_key="w", candidate=f"c{i}",
                                          record=[{"t": "x" * 4000}, [1.0], {}, []], run_us=1.0,
                                          job_id="j", measured_at=time.time() - 60))
        proc = run_farm(["doctor", "--broker", url], tmp_path, timeout_s=300)
    finally:
        svc.stop()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines() if "store capacity" in x)
    assert line.startswith("[WARN] store capacity: ") and "300 measurements" in line, line
    assert "full in 0." in line and "fix: raise maxmemory" in proc.stdout, proc.stdout
