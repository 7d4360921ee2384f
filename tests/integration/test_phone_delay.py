"""The benchmarks' slow phone (farm/devices/phone.py): a real RPC server that adds a fixed delay to
every measurement session, and an unslowed one for comparison, side by side."""

from __future__ import annotations

import time

import numpy as np
import pytest

from farm.devices.tracker import wait_for_phones
from farm.local import services

pytestmark = pytest.mark.integration


def session_s(tracker: str, key: str, lib: str) -> float:
    """One measurement session as MetaSchedule's runner makes it: upload, load, run."""
    import tvm
    from tvm import rpc

    host, port = tracker.split(":")
    t0 = time.monotonic()
    remote = rpc.connect_tracker(host, int(port)).request(key, session_timeout=60)
    remote.upload(lib)
    f = remote.load_module("add.so")["main"]
    dev = remote.cpu(0)
    a = tvm.runtime.tensor(np.ones(4, "float32"), dev)
    b = tvm.runtime.tensor(np.zeros(4, "float32"), dev)
    f(a, b)
    assert np.array_equal(b.numpy(), np.full(4, 2.0, "float32"))
    return time.monotonic() - t0


def test_a_slow_phone_adds_its_delay_to_every_session(tmp_path):
    import tvm
    from tvm import te

    x = te.placeholder((4,), name="x")
    y = te.compute((4,), lambda i: x[i] * 2.0, name="y")
    lib = str(tmp_path / "add.so")
    tvm.compile(te.create_prim_func([x, y]), target="llvm").export_library(lib)
    group = services.ServiceGroup()
    try:
        svc, tracker = services.start_tracker(tmp_path)
        group.add(svc)
        group.add(services.start_phone(tracker, "fast", 0, tmp_path))
        group.add(services.start_phone(tracker, "slow", 1, tmp_path,
                                       services.PhoneOptions(delay_s=1.5)))
        wait_for_phones(tracker, "fast", 1, 60)
        wait_for_phones(tracker, "slow", 1, 60)
        for _ in range(2):  # every session, not only the first
            fast, slow = session_s(tracker, "fast", lib), session_s(tracker, "slow", lib)
            assert slow >= 1.5 and slow - fast >= 1.0, (fast, slow)
    finally:
        group.stop()
