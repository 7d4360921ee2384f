"""The farm as a lab installs it: the wheel `make dist` builds, installed (not editable) into a
fresh virtual environment and run from outside the checkout: `farm --version`, `farm doctor`,
the emulated arm64 phone made from the installed package's own C++ source, and a tiny model
tuned, compiled and checked on the embedded farm.

The wheel's dependencies (apache-tvm, torch, Celery, ...: ~1.5 GB, the pins of pyproject) are
not downloaded again: the new environment sees this test run's site-packages after its own
(a .pth file), so every module of the farm comes from the installed wheel (checked) and only
its dependencies from here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from farm.devices import arm64sim
from tests.integration.test_lab import mlp_model

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def installed(built_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                           "--quiet", "--no-deps", "--no-index", str(built_wheel)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig."
                                "get_paths()['purelib'])"], check=True, capture_output=True,
                               text=True).stdout.strip())
    (site / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # nothing of the checkout: not on PYTHONPATH, not the working folder
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    work = tmp_path_factory.mktemp("elsewhere")
    return {"bin": venv / "bin", "python": python, "site": site, "env": env, "work": work}


def run(installed: dict, *argv: str, env: dict | None = None,
        timeout_s: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                          timeout=timeout_s, cwd=installed["work"],
                          env={**installed["env"], **(env or {})})


def test_the_installed_wheel_runs_the_farm_from_its_own_files(installed, tmp_path):
    where = run(installed, installed["python"], "-c",
                "import farm, workers, farm.devices.arm64sim as a; "
                "print(farm.__file__); print(workers.__file__); print(a.SOURCE)")
    assert where.returncode == 0, where.stderr[-2000:]
    for path in where.stdout.split():
        assert Path(path).is_relative_to(installed["site"]), where.stdout  # not the checkout

    version = run(installed, installed["bin"] / "farm", "--version")
    assert version.returncode == 0 and "tunefarm" in version.stdout + version.stderr, version

    home = tmp_path / "home"
    doctor = run(installed, installed["bin"] / "farm", "doctor", env={"FARM_HOME": str(home)})
    assert doctor.returncode == 0 and "[pass] embedded Redis" in doctor.stdout, \
        doctor.stdout + doctor.stderr

    # the arm64 phone, compiled from the installed package's tvm_rpc.cc (a fresh folder)
    missing = arm64sim.missing_tools()
    assert not missing, f"apt-get install {' '.join(missing)} (`make test` does it as root)"
    phone = run(installed, installed["python"], "-c",
                "from pathlib import Path; from farm.devices import arm64sim; "
                f"print(arm64sim.prepare(Path({str(tmp_path / 'arm64')!r})))")
    assert phone.returncode == 0, phone.stderr[-2000:]
    assert Path(phone.stdout.split()[-1]).is_file()

    model = mlp_model(tmp_path / "tiny.pt2", [24, 12])
    out = tmp_path / "out"
    tuned = run(installed, installed["bin"] / "farm", "submit", model, "--trials-per-task", "2",
                "--phones", "1", "--out", out, "--json", env={"FARM_HOME": str(home)},
                timeout_s=900)
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["numerics_ok"] and all(t["best_us"] for t in summary["tasks"]), summary
    assert (out / "model.so").is_file() and (out / "report.html").is_file()
