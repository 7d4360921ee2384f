"""A worker host refuses a round whose target its CPU cannot run, and says why (real farm)."""

from __future__ import annotations

import platform

import pytest

from tests.faults.conftest import tiny_model
from tests.helpers import run_farm
from tests.unit.test_hostcpu import foreign_cpu

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(platform.machine() != "x86_64", reason="x86 CPU names")]


def test_a_round_for_another_cpu_is_refused_with_the_reason(tmp_path):
    cpu = foreign_cpu()
    toml = tmp_path / "farm.toml"
    toml.write_text(f'[profiles.cpu-local]\ntarget = {{ kind = "llvm", mcpu = "{cpu}" }}\n')
    model = tiny_model(tmp_path / "mlp.pt2", width=20, layers=1)
    proc = run_farm(["submit", str(model), "--trials-per-task", "2", "--out",
                     str(tmp_path / "out")], tmp_path / "home", timeout_s=600,
                    env={"FARM_CONFIG": str(toml)})
    assert proc.returncode == 6, (proc.stdout[-2000:], proc.stderr[-3000:])  # tune
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("farm: error: ") and "every task failed" in last, last
    assert f"cannot run code for target mcpu={cpu}: it lacks" in last, last
