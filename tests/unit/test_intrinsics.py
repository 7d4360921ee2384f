"""The CPU tensor intrinsics are registered without TVM's GPU ones (farm/devices/intrinsics.py),
and TuneContext's own `import tvm.s_tir.tensor_intrin` then parses nothing more; a phone GPU
(OpenCL) needs none more, a kind that tensorizes its own."""

import os
import subprocess
import sys

from farm.devices.lean import without_torch

SCRIPT = """
import sys
from farm.devices.intrinsics import load_for
from tvm.s_tir import TensorIntrin

print(load_for("llvm"))
import tvm.s_tir.tensor_intrin  # what TuneContext does: must not load the GPU ones now
for name in ("dot_16x4_vnni", "dot_4x4_i8i8s32_neon"):  # x86 VNNI, Arm NEON
    assert TensorIntrin.get(name, allow_missing=True) is not None, name
assert "tvm.s_tir.tensor_intrin.cuda" not in sys.modules
print(load_for("opencl"))  # a phone GPU's rules tensorize nothing: none more
assert "tvm.s_tir.tensor_intrin.cuda" not in sys.modules
print(load_for("hexagon"))  # a kind that tensorizes gets its own (CUDA's alone parse ~22 s)
assert TensorIntrin.get("dot_32x4_u8u8i32_vrmpy", allow_missing=True) is not None
assert "tvm.s_tir.tensor_intrin.cuda" not in sys.modules
print(load_for("llvm"))  # loaded once
"""


def test_cpu_intrinsics_alone_then_the_gpu_ones_when_asked():
    # a worker's process (which this is about) imports no torch (farm/devices/lean.py)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=300, env=without_torch(dict(os.environ)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "['dot_product_common', 'x86', 'arm_cpu', 'riscv_cpu']"
    assert lines[1] == "[]"
    assert lines[2] == "['hexagon']"
    assert lines[3] == "[]"
