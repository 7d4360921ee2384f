"""Redis crashes (SIGKILL, not a clean shutdown) mid-round, and a round message vanishes from
the broker: every acknowledged record survives (appendfsync always), the lost rounds run again
through the supervisor, and a `--no-wait` job finishes with no client attached."""

from __future__ import annotations

import json
import signal
import time

import pytest
import redis

from farm.jobs.dispatch import queue_for
from farm.store.broker import queue_lists
from tests.faults.conftest import (
    check_store,
    job_counts,
    record_sets,
    run_through_fault,
    tiny_model,
    total,
    wait_until,
)
from tests.helpers import run_farm

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def test_redis_killed_mid_round(healthy, tmp_path):
    timing = {}

    def kill_redis():
        before = record_sets(healthy.redis)  # acknowledged: must survive the crash
        healthy.redis_svc.signal(signal.SIGKILL)
        healthy.redis_svc.popen.wait(timeout=10)
        time.sleep(2)
        healthy.heal()  # the same Redis, started again from its AOF
        timing["restarted"] = time.monotonic()
        wait_until("a new record after the restart",
                   lambda: total(record_sets(healthy.redis)) > total(before), timeout_s=120)
        timing["measuring"] = time.monotonic()
        return before

    run_through_fault(healthy, tmp_path, kill_redis, trials=8, width=36)
    resumed_s = timing["measuring"] - timing["restarted"]
    print(f"\nRedis SIGKILL: rounds measuring again {resumed_s:.0f} s after the restart")
    # far below the broker's visibility timeout (1800 s); a pool child that imports TVM
    # again after the outage took 75-105 s here, one forked warm 24 s
    assert resumed_s < 90


def test_a_no_wait_job_whose_round_messages_vanish_finishes_without_a_client(healthy, tmp_path):
    model = tiny_model(tmp_path / "vanish.pt2", width=28)
    store = healthy.store()
    healthy.worker.signal(signal.SIGSTOP)  # the rounds wait in the broker's lists...
    try:
        # the stopped worker's last beat stays in the store for the submit, which may take
        # longer than the farm's short host TTL (FAULT_ENV); its next beat replaces this one
        beat = next(b for b in store.hosts() if b.name == healthy.host(0))
        store.publish_host(beat, ttl_s=300)
        proc = run_farm(["submit", str(model), "--trials-per-task", "8", "--no-wait",
                         "--out", str(tmp_path / "out")], tmp_path, env=healthy.env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        job_id = json.loads(proc.stdout)["job_id"]
        broker = redis.Redis.from_url(healthy.redis)
        lost = sum(broker.llen(q) for q in queue_lists(queue_for("cpu-local")))
        broker.delete(*queue_lists(queue_for("cpu-local")))  # ...and are lost
        # a worker blocked in BRPOP when it was stopped may hold one already
        assert lost >= 1, lost
    finally:
        healthy.worker.signal(signal.SIGCONT)
    t0 = time.monotonic()
    wait_until("the job finalized by the farm",
               lambda: store.job_status(job_id).get("state") == "finalized", timeout_s=600)
    print(f"\nround messages deleted: the job finished {time.monotonic() - t0:.0f} s later "
          f"with no client")
    states = store.task_states(job_id)
    assert all(s.state in ("done", "exhausted") for s in states.values()), states
    assert store.job_status(job_id)["finalized_by"].startswith(("supervisor", "worker"))
    counts = job_counts(healthy.redis, job_id)
    assert sum(1 for c in counts.values() if c["retries"] >= 1) >= lost, counts  # sent again
    assert sum(c["duplicates"] for c in counts.values()) == 0, counts
    assert all(c["new"] >= 1 for c in counts.values()), counts
    # `farm wait` only reads and compiles now: the finished job's results, the same choice
    done = run_farm(["wait", job_id], tmp_path, env=healthy.env, timeout_s=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["job_id"] == job_id
    check_store(healthy, summary)
