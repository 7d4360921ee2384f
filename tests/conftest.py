"""Shared fixtures: a private Redis on a free loopback port, started and stopped by the test run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from farm.local import services
from tests.helpers import tidy_meta_schedule_loggers

# every farm the tests start (their processes inherit the environment) evolves 64 schedules a
# batch instead of MetaSchedule's 512: the tests tune a few trials a round, where the search,
# not the phones, took most of a round's time (a warm 4-trial round: 5-8 s -> 2-3 s here)
os.environ.setdefault("FARM_SEARCH_POPULATION", "64")
# and measure on the emulated phones for 20 ms at least, not 100 (tests/farm.toml says why)
os.environ.setdefault("FARM_CONFIG", str(Path(__file__).resolve().parent / "farm.toml"))
# the OpenCL phones' runtime is built from TVM's sources the project is given beside it
# (../shared/tvm-src: its README says which commit; farm/devices/opencl.py)
_TVM_SRC = Path(__file__).resolve().parents[2] / "shared" / "tvm-src"
if _TVM_SRC.is_dir():
    os.environ.setdefault("TVM_SOURCE", str(_TVM_SRC))


@pytest.fixture(scope="session", autouse=True)
def opencl_runtime_built_once(tmp_path_factory: pytest.TempPathFactory) -> None:
    """TVM's OpenCL runtime for the OpenCL phones is built once per test run (about 10 s), in
    the run's own folder, and every farm the tests start (they inherit the environment) uses
    it."""
    if "FARM_OPENCL_ROOT" not in os.environ:
        os.environ["FARM_OPENCL_ROOT"] = str(tmp_path_factory.mktemp("opencl-runtime"))


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not on PATH: the tests start real Redis servers "
                    "(`make system-deps` installs it as root on Debian/Ubuntu: apt-get "
                    "install redis-server; elsewhere your system's redis package)")
    data = tmp_path_factory.mktemp("redis")
    svc, url = services.start_redis(data, data)
    try:
        yield url
    finally:
        svc.stop()


@pytest.fixture
def clean_redis(redis_url: str) -> Iterator[str]:
    import redis

    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    yield redis_url
    r.flushdb()
    r.close()


@pytest.fixture(scope="session")
def example_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example models (CNN, mobile block, transformer block) as .pt2 and .pt."""
    out = tmp_path_factory.mktemp("models")
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, str(root / "examples" / "make_models.py"),
                    str(out)], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module", autouse=True)
def _meta_schedule_logger_per_module() -> None:
    tidy_meta_schedule_loggers()


@pytest.fixture(autouse=True)
def _meta_schedule_logger_per_test() -> None:
    tidy_meta_schedule_loggers()


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel `make dist` builds, made once per test run from the files git tracks, copied
    (a build/ folder left in the checkout would hand the wheel files the package data does
    not name)."""
    root = Path(__file__).resolve().parents[1]
    tracked = subprocess.run(["git", "ls-files"], cwd=root, check=True, capture_output=True,
                             text=True).stdout.split()
    work = tmp_path_factory.mktemp("wheel")
    for name in tracked:
        if (root / name).is_file():
            (work / "src" / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, work / "src" / name)
    built = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir",
                            str(work / "dist"), str(work / "src")], capture_output=True,
                           text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    return next((work / "dist").glob("tunefarm-*.whl"))
