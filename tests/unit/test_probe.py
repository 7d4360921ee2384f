"""`farm doctor`'s candidate (farm/devices/probe.py) builds for every kind of profile: a CPU
one, and an OpenCL one (a GPU kernel with unbound loops does not build: the check would have
failed with a build error on every OpenCL phone, its own step misnamed)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("target", [{"kind": "llvm"},
                                    {"kind": "opencl", "host": {"kind": "llvm"}}])
def test_the_probe_candidate_and_its_reference_build_for_the_target(target):
    import tvm

    from farm.devices.probe import candidate, workload

    gpu = target["kind"] != "llvm"
    mod = workload()
    for scheduled in (candidate(mod, gpu), candidate(mod, gpu, threads=32) if gpu else mod):
        assert tvm.compile(scheduled, target=tvm.target.Target(target)) is not None
