"""Phone GPUs: OpenCL phones on loopback, as the farm's users have Mali and Adreno phones.

Each phone is a runtime-only TVM RPC server with TVM's OpenCL runtime (built in this test
session from TVM's sources, farm/devices/opencl.py) and pocl's CPU device as its OpenCL
device; `FARM_PHONE_WORK_GROUP` / `farm phones --work-group` give it a phone GPU's work-group
limit (POCL_MAX_WORK_GROUP_SIZE). Candidates are OpenCL C plus host code, built and linked on
the worker host, uploaded, run on the phone's OpenCL device and checked against TVM's default
GPU schedule."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from farm.core.config import load_config
from farm.devices import opencl
from farm.devices.tracker import request_phone, wait_for_phones
from farm.local import services
from tests.helpers import redis_and_tracker, run_farm

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def small_cnn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small CNN the team did not tune to: a conv, a depthwise conv, a pool, a linear head."""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
            self.fc = nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.dw(torch.relu(self.conv(x))))
            return self.fc(y.mean(dim=(2, 3)))

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("opencl-model") / "small_cnn.pt2"
    torch.export.save(torch.export.export(Net().eval(), (torch.randn(1, 3, 16, 16),)), path)
    return path


def test_a_small_cnn_tunes_on_two_opencl_phones(small_cnn: Path, tmp_path: Path) -> None:
    """`farm submit --device-key opencl-local`: the embedded farm's two phones are OpenCL
    phones with a phone GPU's 256-thread work-groups; the profile leaves the limits out and
    takes the phone's; every task tunes, the tuned model runs on the phones' OpenCL device,
    matches torch and beats TVM's default GPU schedules."""
    out = tmp_path / "out"
    proc = run_farm(["submit", str(small_cnn), "--device-key", "opencl-local", "--phones", "2",
                     "--trials-per-task", "4", "--out", str(out)], tmp_path / "home",
                    timeout_s=900, env={"FARM_PHONE_WORK_GROUP": "256"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    said = proc.stdout + proc.stderr
    assert "the GPU's limits read from a phone: max_threads_per_block 256" in said, said[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["target"]["kind"] == "opencl"
    assert summary["target"]["max_threads_per_block"] == 256
    assert summary["numerics_ok"], summary
    assert "phone of key opencl-local" in summary["measured_on"]
    assert len(summary["tasks"]) >= 3
    for t in summary["tasks"]:  # every task valid, its default GPU schedule measured too
        assert t["best_us"] is not None and t["default_us"] is not None, t
        assert t["best_us"] <= t["default_us"], t
    lat = summary["latency_us"]
    assert lat["tuned"] < lat["untuned"], lat
    report = (out / "report.html").read_text()
    assert all(t["name"] in report for t in summary["tasks"])
    # best/ is a MetaSchedule database plain TVM applies: each record replays on its workload
    # and builds an OpenCL kernel for the job's target
    import tvm
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    db = JSONDatabase(work_dir=str(out / "best"), module_equality="structural")
    records = db.get_all_tuning_records()
    assert len(records) == len(summary["tasks"])
    target = tvm.target.Target(summary["target"])
    for rec in records:
        built = tvm.compile(rec.as_measure_candidate().sch.mod, target=target)
        assert [m.kind for m in built.mod.imports] == ["opencl"]


@pytest.fixture(scope="module")
def narrow_phones(tmp_path_factory: pytest.TempPathFactory):
    """A lab farm on loopback: Redis, a tracker, two OpenCL phones whose largest work-group is
    64 threads (below the 256 profile pocl-256 claims), a worker."""
    folder = tmp_path_factory.mktemp("opencl-lab")
    home = folder / "home"
    config = load_config({}, env={"FARM_HOME": str(home), **os.environ})
    with redis_and_tracker(folder) as (group, broker, tracker):
        for i in range(2):
            group.add(services.start_phone(tracker, "pocl-256", i, folder, services.PhoneOptions(
                opencl=True, work_group=64), config))
        wait_for_phones(tracker, "pocl-256", 2, timeout_s=120)
        env = {"FARM_HOME": str(home), "FARM_BROKER_URL": broker}
        group.add(services.start_worker(tracker, broker, folder, env=env,
                                        extra=["--keys", "pocl-256"]))
        yield tracker, env, home, folder


def test_doctor_names_a_work_group_limit_the_phone_lacks(narrow_phones) -> None:
    tracker, env, home, _ = narrow_phones
    proc = run_farm(["doctor", "--tracker", tracker, "--device-key", "pocl-256"], home,
                    timeout_s=300, env=env)
    assert proc.returncode != 0, proc.stdout
    line = next(x for x in proc.stdout.splitlines() if "the phone's GPU" in x)
    assert line.startswith("[FAIL]"), proc.stdout
    assert "max_threads_per_block 256 (the phone's: 64)" in line, line
    # the whole path still works with a candidate within the phone's limit
    assert "[pass] a candidate on a phone" in proc.stdout, proc.stdout


def test_over_limit_candidates_are_invalid_with_the_phones_words(narrow_phones, small_cnn,
                                                                 tmp_path) -> None:
    """A job with a profile that claims 256 threads on phones of 64: the candidates over the
    limit are invalid kernels with OpenCL's own error (not a lost phone), the job still tunes
    every task on the candidates within it."""
    tracker, env, home, folder = narrow_phones
    logs = [folder / f"phone-pocl-256-{i}.log" for i in range(2)]
    before = [len(log.read_bytes()) for log in logs]
    out = tmp_path / "out"
    # 8 trials a task: a random GPU schedule of a small reduction fails often (over the
    # limit, or TVM's own build error "load_remap_"): at 4, all of the mean's failed once
    proc = run_farm(["submit", str(small_cnn), "--device-key", "pocl-256", "--tracker", tracker,
                     "--trials-per-task", "8", "--out", str(out)], home, timeout_s=900, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["numerics_ok"] and all(t["best_us"] is not None for t in summary["tasks"])
    runtime = sum(t["failures"].get("runtime", 0) for t in summary["tasks"])
    assert runtime > 0 and all(t["device_lost"] == 0 for t in summary["tasks"]), summary["tasks"]
    said = [t["errors"].get("runtime", "") for t in summary["tasks"]]
    assert any("CL_INVALID_WORK_GROUP_SIZE" in e for e in said), said
    for log, start in zip(logs, before, strict=True):  # no session died of it
        during = log.read_bytes()[start:].decode(errors="replace")
        assert "crashed" not in during, during[-2000:]


def test_a_kernel_that_fails_to_build_on_the_phone_is_its_error_not_a_lost_phone(
        narrow_phones, tmp_path) -> None:
    """An OpenCL C program the phone's compiler refuses: the session reports the build log,
    the worker's classification calls it an invalid kernel (runtime), and the phone serves the
    next session."""
    import tvm
    from tvm import s_tir, te

    from workers.metaschedule.runner import classify_run_error

    tracker = narrow_phones[0]
    a = te.placeholder((256,), name="a")
    b = te.compute((256,), lambda i: a[i] * 2.0, name="b")
    sch = s_tir.Schedule(te.create_prim_func([a, b]))
    bx, tx = sch.split(sch.get_loops(sch.get_sblock("b"))[0], [None, 16])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    target = tvm.target.Target({"kind": "opencl", "host": {"kind": "llvm"}})
    good, bad = tmp_path / "good.so", tmp_path / "bad.so"
    tvm.compile(sch.mod, target=target).export_library(str(good))
    blob = good.read_bytes()
    assert blob.count(b"__kernel void") >= 1
    bad.write_bytes(blob.replace(b"__kernel void", b"__kernel vxid"))  # same length: still loads
    values = np.arange(256, dtype="float32")

    def run(lib: Path) -> np.ndarray:
        remote = request_phone(tracker, "pocl-256", 60)
        remote.upload(str(lib))
        f = remote.load_module(lib.name)["main"]
        dev = remote.device("opencl", 0)
        x, y = tvm.runtime.tensor(values, dev), tvm.runtime.tensor(np.zeros(256, "float32"), dev)
        f(x, y)
        dev.sync()
        return y.numpy()

    with pytest.raises(Exception) as refused:  # noqa: B017 - TVM's error from the phone
        run(bad)
    text = str(refused.value)
    assert re.search(r"OpenCL build error|CL_BUILD_PROGRAM_FAILURE|build", text, re.I), text
    assert classify_run_error(text) == "runtime", text
    np.testing.assert_allclose(run(good), values * 2.0)  # the phone lives on


def test_an_opencl_kernel_that_crashes_its_session_leaves_the_phone_serving(
        narrow_phones, tmp_path) -> None:
    """A kernel that reads 4 GB out of bounds on the OpenCL device kills its session's
    process; the phone serves the next session."""
    import tvm
    from tvm import s_tir, te

    tracker = narrow_phones[0]
    x = te.placeholder((64,), name="x")
    y = te.compute((64,), lambda i: x[i + 1_000_000_000] * 2.0, name="y")
    sch = s_tir.Schedule(te.create_prim_func([x, y]))
    sch.bind(sch.get_loops(sch.get_sblock("y"))[0], "threadIdx.x")
    lib = tmp_path / "crash.so"
    target = tvm.target.Target({"kind": "opencl", "host": {"kind": "llvm"}})
    tvm.compile(sch.mod, target=target).export_library(str(lib))
    remote = request_phone(tracker, "pocl-256", 60)
    remote.upload(str(lib))
    dev = remote.device("opencl", 0)
    a = tvm.runtime.tensor(np.ones(64, "float32"), dev)
    b = tvm.runtime.tensor(np.zeros(64, "float32"), dev)
    with pytest.raises(Exception):  # noqa: B017 - the session's process died: TVM's error
        remote.load_module("crash.so")["main"](a, b)
        dev.sync()
    again = request_phone(tracker, "pocl-256", 60)  # a phone of the key answers again
    assert again.device("opencl", 0).exist


def test_the_limits_a_profile_leaves_out_are_the_phones(narrow_phones) -> None:
    tracker = narrow_phones[0]
    remote = request_phone(tracker, "pocl-256", 60)
    limits, name = opencl.phone_limits(remote, "opencl")
    assert limits["max_threads_per_block"] == 64 and name
    filled = opencl.with_phone_limits({"kind": "opencl", "max_shared_memory_per_block": 4096},
                                      limits)
    assert filled["max_threads_per_block"] == 64 and filled["max_num_threads"] == 64
    assert filled["max_shared_memory_per_block"] == 4096  # the profile's own stays
    assert opencl.over_limits({"kind": "opencl", "max_threads_per_block": 128}, limits) == [
        "max_threads_per_block 128 (the phone's: 64)"]
    assert opencl.over_limits({"kind": "opencl", "max_threads_per_block": 64}, limits) == []
