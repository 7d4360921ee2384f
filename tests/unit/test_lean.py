"""The farm's processes that never read a model start without torch (farm/devices/lean.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from farm.devices.lean import SHADOW, without_torch

PROBE = ("import sys, tvm\n"
         "print('torch' in sys.modules)\n"
         "try:\n"
         "    import torch\n"
         "    print('imported')\n"
         "except ImportError as e:\n"
         "    print('refused:', e)\n")


def run(env: dict[str, str]) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.splitlines()


def test_a_lean_process_imports_tvm_without_torch_and_keeps_its_pythonpath(tmp_path):
    env = without_torch({**os.environ, "PYTHONPATH": str(tmp_path)})
    assert env["PYTHONPATH"].split(os.pathsep) == [SHADOW, str(tmp_path)]
    assert without_torch(env)["PYTHONPATH"] == env["PYTHONPATH"]  # once, however often applied
    loaded, refused = run(env)
    assert loaded == "False"
    assert refused.startswith("refused:") and "farm/devices/lean.py" in refused


def test_without_it_tvm_imports_torch_where_torch_is_installed():
    """The reason for lean processes: TVM's FFI imports an installed torch by itself."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    loaded, imported = run(env)
    assert (loaded, imported) == ("True", "imported")


def test_hide_torch_covers_the_process_and_its_children():
    code = ("import os, subprocess, sys\n"
            "from farm.devices.lean import hide_torch\n"
            "hide_torch()\n"
            "try:\n"
            "    import torch\n"
            "    print('parent imported')\n"
            "except ImportError:\n"
            "    print('parent refused')\n"
            "sys.stdout.flush()\n"
            f"subprocess.run([sys.executable, '-c', {PROBE!r}], check=True)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    parent, loaded, refused = proc.stdout.splitlines()
    assert parent == "parent refused" and loaded == "False" and refused.startswith("refused:")
