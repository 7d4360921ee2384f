"""Worker processes killed mid-round, on one host: the round runs again and nothing is lost or
measured twice; a round that kills its process every time fails its task (a poison round)."""

from __future__ import annotations

import signal
import time

import psutil
import pytest

from tests.faults.conftest import run_through_fault, start_submit, tiny_model, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def kill_pool(worker) -> list[int]:
    """SIGKILL the worker's pool children and what they started (build processes)."""
    return [p.pid for p in signal_pool(worker, signal.SIGKILL)]


def signal_pool(worker, sig: int, procs: list | None = None) -> list:
    """Send `sig` to the worker's pool children and what they started (or to `procs`)."""
    if procs is None:
        procs = [p for c in psutil.Process(worker.pid).children()
                 for p in [c, *c.children(recursive=True)]]
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    return procs


def running_in_pool(farm, store, trials: int) -> bool:
    """Does a pool child of the farm's worker run a round (hold its lease) whose workload still
    lacks records (so a kill lands mid-round, not between its last record and its end)?"""
    import redis

    from farm.core import keys

    pids = {c.pid for c in psutil.Process(farm.worker.pid).children()}
    r = redis.Redis.from_url(farm.redis, decode_responses=True)
    try:
        for k in r.scan_iter(keys.key_for("round", "*", "lease")):
            h = r.get(k)
            if not (h and h.rsplit("|", 1)[-1].isdigit() and int(h.rsplit("|", 1)[-1]) in pids):
                continue
            wk = k[len(keys.key_for("round", "")):].split(":")[1]  # job:wk:index:...:lease
            if store.record_count(wk) < trials:
                return True
        return False
    finally:
        r.close()


def test_pool_child_killed_mid_round(healthy, tmp_path):
    trials = 12  # a task's: 3 rounds of FAULT_ENV's 4 trials

    def kill_pool_child():
        # a round in flight, not one just ended: a kill between two rounds was no fault
        # (0 retries: a clean-clone run of 2026-12-04, with rounds of one short batch). The
        # pool is stopped while it is checked, so the round seen is the round killed
        store = healthy.store()  # once: the check runs every 50 ms

        def stopped_mid_round() -> bool:
            pool = signal_pool(healthy.worker, signal.SIGSTOP)
            if running_in_pool(healthy, store, trials):
                return True
            signal_pool(healthy.worker, signal.SIGCONT, pool)
            return False

        wait_until("a round running in a pool child", stopped_mid_round, 120, every_s=0.05)
        assert kill_pool(healthy.worker), "the worker has no pool child"

    # 12 trials over rounds of 4 (FAULT_ENV): the job's rounds follow each other; a round
    # holding its lease counts, whether it waits for its slot or measures: it runs again
    summary = run_through_fault(healthy, tmp_path, kill_pool_child, trials=trials, width=52)
    assert sum(t["retries"] for t in summary["tasks"]) >= 1, summary["tasks"]


def test_a_round_that_kills_its_process_every_time_fails_its_task(healthy, tmp_path):
    from farm.jobs.fence import POISON_AFTER

    model = tiny_model(tmp_path / "poison.pt2", width=56, layers=1)
    proc = start_submit(healthy, model, tmp_path / "out", tmp_path / "home", trials=8)
    store = healthy.store()
    kills, since = 0, time.time()
    try:
        def round_started() -> bool:
            return any(s.state == "tuning" and s.updated_at > since
                       for j in store.job_ids() for s in store.task_states(j).values())

        while kills < POISON_AFTER:  # every start of the round kills its process
            wait_until(f"start {kills + 1} of the round", round_started, timeout_s=300,
                       every_s=0.2)
            since = time.time()
            assert kill_pool(healthy.worker)
            kills += 1
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 6, err[-3000:]  # every task failed: exit code of a TuneError
    assert f"killed its worker process {POISON_AFTER} times (a poison round)" in err, err[-3000:]
    job_id = next(j for j in store.job_ids() if store.get_job(j).model == "poison")
    assert store.job_status(job_id)["state"] == "finalized"  # the job ended; nothing hangs
    states = list(store.task_states(job_id).values())
    assert [s.state for s in states] == ["failed"], states
