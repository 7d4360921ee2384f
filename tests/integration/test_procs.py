"""A round process's builds and measurements share TVM's helper processes (workers/round/procs.py):
real `tvm.exec.popen_worker` processes, each call on an idle one, a deadline that kills only
the process that overran, and the round's builder and runner wired to the same set."""

from __future__ import annotations

import os
import time

import pytest

from tests.helpers import tvm_children_without_torch
from workers.round.procs import Processes

pytestmark = pytest.mark.integration


def pid_after(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


@pytest.fixture
def processes():
    procs = Processes()
    with tvm_children_without_torch():  # as a worker's: ~2.5 s a process, not ~6
        yield procs
    procs.shutdown()


def test_builds_then_runs_reuse_the_same_processes(processes):
    builds, runs = processes.view(2, timeout_s=60), processes.view(2, timeout_s=30)
    built = {f.result() for f in [builds.submit(pid_after, 0.5) for _ in range(2)]}
    ran = {f.result() for f in [runs.submit(pid_after, 0.5) for _ in range(2)]}
    assert len(built) == 2 and ran == built  # the runs found the builds' processes idle
    assert processes.started == 2
    assert os.getpid() not in built


def test_a_view_runs_at_most_its_width_at_once(processes):
    one = processes.view(1, timeout_s=60)
    t0 = time.monotonic()
    pids = [r.value for r in one.map_with_error_catching(lambda s: pid_after(s), [0.6, 0.6])]
    assert time.monotonic() - t0 >= 1.2  # one after the other
    assert len(set(pids)) == 1 and processes.started == 1


def test_a_call_past_its_deadline_kills_only_its_process_which_comes_back(processes):
    runs = processes.view(1, timeout_s=1.0)
    first = runs.submit(pid_after, 0).result()
    with pytest.raises(TimeoutError):
        runs.submit(pid_after, 10).result()
    again = runs.submit(pid_after, 0).result()
    assert again != first  # the frozen call's process was killed, a new one took its place
    results = list(runs.map_with_error_catching(lambda s: pid_after(s), [10]))
    assert results[0].status.name == "TIMEOUT"


def test_a_rounds_builder_and_runner_share_one_set(tmp_path):
    from farm.core.config import load_config
    from farm.core.profiles import resolve_profile
    from workers.round.context import WorkerContext

    ctx = WorkerContext(config=load_config({}, env={"FARM_HOME": str(tmp_path)}),
                        tracker="127.0.0.1:9")
    profile = resolve_profile("cpu-local", {})
    runner = ctx.runner(profile, phones=3)
    builder = ctx.builder(profile)
    assert runner.pool.processes is builder.pool.processes is ctx.processes()
    assert ctx.processes().started == 0  # nothing started until a round needs it
