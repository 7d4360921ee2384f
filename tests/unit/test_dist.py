"""The wheel `make dist` builds holds everything the farm needs at run time: every file of
farm/ and workers/ that git tracks (the Lua scripts of the store, the arm64 phone's C++
source, the torch shadow; a non-editable install, the worker Dockerfile's included, could
not build the arm64 phone while tvm_rpc.cc was no package data), the LICENSE, and the
`farm` command."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_every_file_the_farm_runs_with(built_wheel):
    wheel = built_wheel
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True,
                             text=True).stdout.split()
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = [p for p in tracked if p.startswith(("farm/", "workers/"))]
    assert tracked and {p for p in tracked if not p.endswith(".pyi")} - names == set()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), sorted(names)[-5:]
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "farm = farm.client.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()
