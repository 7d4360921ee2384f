"""A round process's builds and measurements share TVM's helper processes (workers/metaschedule/procs.py):
real `tvm.exec.popen_worker` processes, each call on an idle one, a deadline that kills only
the process that overran, and the round's builder and runner wired to the same set."""

from __future__ import annotations

import os
import time

import pytest

from tests.helpers import tvm_children_without_torch
from workers.metaschedule.procs import Processes

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


def burn(cpu_s: float, child: bool = False, fail: bool = False) -> int:
    """`cpu_s` CPU seconds in this process, or in a child it waits for (a build's linker)."""
    import subprocess
    import sys

    if child:
        subprocess.run([sys.executable, "-c", f"import time\nt = time.process_time()\n"
                        f"while time.process_time() - t < {cpu_s}: pass"], check=True)
    else:
        t = time.process_time()
        while time.process_time() - t < cpu_s:
            pass
    if fail:
        raise ValueError("burnt")
    return os.getpid()


def test_each_view_counts_the_cpu_its_calls_took_in_their_processes(processes):
    """What a round's CPU account (workers/round/account.py) reads: a view's calls' CPU in the
    helper processes, their waited children (the linker) and a process's start included, a
    call that raised too; read against what the kernel says the processes spent."""
    import psutil

    builds, runs = processes.view(1, timeout_s=60), processes.view(1, timeout_s=60)
    pid = builds.submit(burn, 0.4).result()
    builds.submit(burn, 0.4, child=True).result()
    with pytest.raises(ValueError, match="burnt"):
        runs.submit(burn, 0.3, fail=True).result()
    times = psutil.Process(pid).cpu_times()
    spent = times.user + times.system + times.children_user + times.children_system
    assert processes.started == 1
    assert builds.cpu_s >= 0.78 and runs.cpu_s >= 0.28  # os.times counts in ticks of 10 ms
    # the process's whole CPU, its start (TVM's import) included, is told to one view or the other
    assert abs(builds.cpu_s + runs.cpu_s - spent) < 0.05
    assert builds.cpu_s > 0.8 + 0.3  # the start landed on its first call, a build


def export_unless_told_to_stall(flag: str, rt_mod: object) -> str:
    """A builder's export (in its build process) that stalls while `flag` exists: a candidate
    whose code generation takes far longer than the others'."""
    from farm.devices.cross import export_shared

    while os.path.exists(flag):
        time.sleep(0.2)
    return export_shared(None, rt_mod)  # type: ignore[arg-type]


def test_a_build_far_slower_than_its_builders_others_is_cut_short(tmp_path, monkeypatch):
    """Once a builder has built a few candidates, one that takes BOUND_FACTOR times their
    90th percentile is killed there (a build failure), not at the setting's 60 s: a random
    schedule with deep unrolling held a build process 42 s in the tests."""
    import functools

    import tvm
    from tvm.s_tir.meta_schedule.builder import BuilderInput

    from farm.devices.probe import candidate, workload
    from workers.metaschedule import builder

    monkeypatch.setattr(builder, "BOUND_AFTER", 2)  # the module's 16, sooner
    monkeypatch.setattr(builder, "BOUND_FLOOR_S", 1.0)
    flag = tmp_path / "stall"
    with tvm_children_without_torch():
        wb = builder.WarmBuilder(1, 60, 64, functools.partial(export_unless_told_to_stall,
                                                              str(flag)))
    try:
        job = BuilderInput(candidate(workload()), tvm.target.Target("llvm"))
        assert wb.bound.seconds() == 60  # no builds seen yet: the setting
        assert [r.error_msg for r in wb.build([job, job])] == [None, None]
        bound = wb.bound.seconds()
        assert 1.0 <= bound < 30, bound
        flag.write_text("")
        t0 = time.monotonic()
        (stalled,) = wb.build([job])
        took = time.monotonic() - t0
        flag.unlink()
        assert stalled.artifact_path is None and took < bound + 10, took
        assert stalled.error_msg.startswith(f"build timeout: killed after {bound:.0f} s")
        assert [r.error_msg for r in wb.build([job])] == [None]  # a fresh process builds on
    finally:
        wb.shutdown()
