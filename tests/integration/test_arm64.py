"""The cross path on an emulated arm64 phone like a real board: a native RPC server on TVM's
aarch64 runtime library only (farm/devices/native/tvm_rpc.cc; no Python, no compiler) under
qemu user mode, candidates and the model cross-compiled here with aarch64-linux-gnu-g++ (what
an NDK profile does), numerics checked against torch. The phone is made once and kept in
~/.cache between test runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from farm.core.config import load_config
from farm.devices import arm64sim
from farm.devices.tracker import wait_for_phones
from farm.local import services
from farm.store import open_store
from tests.helpers import run_farm

pytestmark = [pytest.mark.integration, pytest.mark.arm64]

ROOT = Path(os.environ.get("FARM_ARM64_ROOT")
            or Path.home() / ".cache" / "tunefarm-tests" / "arm64-sim")
ENV = {"FARM_ARM64_ROOT": str(ROOT)}


@pytest.fixture(scope="module")
def arm64_tracker(tmp_path_factory):
    missing = arm64sim.missing_tools()
    assert not missing, f"apt-get install {' '.join(missing)} (`make test` does it as root)"
    logs = tmp_path_factory.mktemp("arm64-logs")
    group = services.ServiceGroup()
    try:
        svc, tracker = services.start_tracker(logs)
        group.add(svc)
        config = load_config({}, env={"FARM_HOME": str(logs), **ENV})
        phone = group.add(services.start_phone(tracker, "arm64-sim", 0, logs,
                                               services.PhoneOptions(arch="arm64"), config))
        wait_for_phones(tracker, "arm64-sim", 1, timeout_s=300)
        # the phone is the native server under qemu: no Python, no TVM compiler in it
        cmdline = Path(f"/proc/{phone.pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[0].endswith(b"qemu-aarch64-static") and cmdline[3].endswith(b"/tvm_rpc")
        maps = Path(f"/proc/{phone.pid}/maps").read_text()
        assert "libtvm_runtime.so" in maps and "libtvm_compiler" not in maps and "python" not in maps
        yield tracker
    finally:
        group.stop()


def test_doctor_cross_compiles_and_runs_a_kernel_on_the_arm64_phone(arm64_tracker, tmp_path):
    proc = run_farm(["doctor", "--tracker", arm64_tracker, "--device-key", "arm64-sim"],
                    tmp_path, timeout_s=300, env=ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[pass] compiler of profile arm64-sim: " in proc.stdout
    assert "targets aarch64-linux-gnu" in proc.stdout
    assert "[pass] a candidate on a phone: a candidate built and linked here, uploaded, loaded, run and checked" in proc.stdout


def test_submit_tunes_on_the_emulated_arm64_phone(arm64_tracker, tmp_path):
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(128, 128)

        def forward(self, x):
            return torch.relu(self.fc(x)) * 0.5

    torch.manual_seed(0)
    model = tmp_path / "block.pt2"
    torch.export.save(torch.export.export(Block().eval(), (torch.randn(16, 128),)), model)
    out = tmp_path / "out"
    home = tmp_path / "home"
    proc = run_farm(["submit", str(model), "--device-key", "arm64-sim", "--trials-per-task",
                     "8", "--phones", "1", "--out", str(out)], home, timeout_s=1500, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["device_key"] == "arm64-sim" and summary["numerics_ok"]
    # tuned on the runtime-only phone: faster there than TVM's default schedule
    assert summary["latency_us"]["tuned"] < summary["latency_us"]["untuned"], summary["latency_us"]
    assert "phone of key arm64-sim" in summary["measured_on"]
    assert summary["target"]["mtriple"] == "aarch64-linux-gnu"
    assert all(t["best_us"] is not None for t in summary["tasks"])
    elf = (out / "model.so").read_bytes()[:20]
    assert elf[:4] == b"\x7fELF" and int.from_bytes(elf[18:20], "little") == 183  # EM_AARCH64
    # the records were measured on the emulated phone, for the aarch64 target
    svc, url = services.start_redis(home / "redis", tmp_path / "logs")
    try:
        store = open_store(url)
        for t in summary["tasks"]:
            records = store.records(t["workload_key"])
            assert records and all(r.record[2]["mtriple"] == "aarch64-linux-gnu"
                                   for r in records)
    finally:
        svc.stop()


def test_the_native_phone_survives_a_crashing_kernel(arm64_tracker, tmp_path):
    """A candidate that segfaults ends its session's process, not the native phone: it logs
    the crash and serves the next session (TVM's Python server needed a guard for this)."""
    import tvm
    from tvm.support import cc

    from farm.core.profiles import resolve_profile
    from farm.devices.probe import probe_phone
    from farm.devices.tracker import request_phone
    from tests.helpers import crash_a_session

    profile = resolve_profile("arm64-sim")
    crash_a_session(request_phone(arm64_tracker, "arm64-sim", 60), tmp_path,
                    tvm.target.Target(profile.target_json()),
                    cc.cross_compiler("aarch64-linux-gnu-g++"))
    got = probe_phone(arm64_tracker, profile, timeout_s=120)  # the next session: served
    assert got.run_us > 0
