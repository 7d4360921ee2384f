"""`farm doctor`'s candidate (farm/devices/probe.py) and a round's reference kernel
(farm/devices/cross.py) build for every kind of profile: a CPU one, and an OpenCL one. On a GPU
an unscheduled function has no kernel: TVM compiled it as host code that wrote through the
device's buffer handles (every first OpenCL session crashed); its reference is TVM's default
GPU schedule, an OpenCL kernel within the threads every phone GPU runs."""

from __future__ import annotations

import re

import pytest


@pytest.mark.parametrize("target", [{"kind": "llvm"},
                                    {"kind": "opencl", "host": {"kind": "llvm"},
                                     "max_threads_per_block": 1024}])
def test_the_probe_candidate_and_its_reference_build_for_the_target(target):
    import tvm

    from farm.devices.cross import REFERENCE_THREADS, gpu_default_schedule
    from farm.devices.probe import candidate, workload

    gpu = target["kind"] != "llvm"
    tvm_target = tvm.target.Target(target)
    mod = workload()
    assert tvm.compile(candidate(mod, gpu), target=tvm_target) is not None
    if not gpu:
        assert tvm.compile(mod, target=tvm_target) is not None
        return
    assert [m.kind for m in tvm.compile(mod, target=tvm_target).mod.imports] == []  # no kernel
    before = tvm.ir.save_json(mod)
    reference = gpu_default_schedule(mod, tvm_target, max_threads=REFERENCE_THREADS)
    assert tvm.ir.save_json(mod) == before  # the workload itself is left as it was
    assert [m.kind for m in tvm.compile(reference, target=tvm_target).mod.imports] == ["opencl"]
    threads = [int(n) for n in re.findall(r'thread_binding\((\d+), thread="threadIdx',
                                          reference.script())]
    assert threads and max(threads) <= REFERENCE_THREADS
