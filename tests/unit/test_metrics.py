"""A worker's collector: the farm-wide series from the leading host only, labelled `job_id`;
the host's own series labelled with its name (workers/host/metrics.py). Against both stores."""

from __future__ import annotations

import pytest

from farm.core.messages import JobSpec
from farm.store import RecordStore, TaskState
from farm.store.hosts import HostBeat
from tests.unit.conftest import rec
from workers.host.metrics import FARM_WIDE, PER_HOST, FarmCollector

Samples = dict[tuple[str, frozenset], float]


class Queues:
    """The broker's queue lists: 3 rounds wait for every key."""

    def depth(self, queue: str) -> int:
        return 3


def a_farm(store: RecordStore) -> None:
    for name, key in (("farm@a", "k"), ("farm@b", "k2")):
        store.publish_host(HostBeat(name=name, tracker="t:9190",
                                    phones={key: {"total": 2, "free": 1, "busy": 1}}), 60)
    store.put_job(JobSpec(job_id="j1", model="m", device_key="k", target={}, trials_per_task=4,
                          round_trials=2, workload_keys=["w1", "w2"],
                          task_names={"w1": "dense", "w2": "relu"}, weights={"w1": 1, "w2": 1}))
    store.set_active("j1", True)
    store.set_task_state("j1", "w1", TaskState(state="tuning", host="farm@a",
                                               failures={"build": 2}))
    store.set_task_state("j1", "w2", TaskState(state="queued"))
    for cand, us in (("c1", 40.0), ("c2", 25.0)):
        store.add_record(rec(cand, us, wk="w1", job="j1"))
    store.count_measurements("j1", "w1", device_lost=1, retries=1)


def scrape(store: RecordStore, node: str, leads: bool) -> Samples:
    collector = FarmCollector(store, Queues(), node, leads=lambda: leads)  # type: ignore[arg-type]
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in collector.collect() for s in family.samples}


def names(samples: Samples) -> set[str]:
    return {n.removesuffix("_total") for n, _ in samples}


def test_only_the_leader_serves_the_farm_wide_series(store):
    a_farm(store)
    leader, other = scrape(store, "farm@a", True), scrape(store, "farm@b", False)
    assert names(other) <= set(PER_HOST) and not names(other) & set(FARM_WIDE)
    assert set(FARM_WIDE) - {"tunefarm_store_memory_used_bytes",
                             "tunefarm_store_memory_max_bytes"} <= names(leader)
    assert leader[("tunefarm_leader", frozenset({("host", "farm@a")}))] == 1
    assert other[("tunefarm_leader", frozenset({("host", "farm@b")}))] == 0
    job = {("job_id", "j1"), ("model", "m")}

    def at(samples: Samples, name: str, **labels: str) -> float:
        return samples[(name, frozenset(job | set(labels.items())))]

    # one meaning per series: a sum over `kind` is every measurement (no parent beside its parts)
    assert ("tunefarm_measurements_total", frozenset(job | {("kind", "measurements")})) \
        not in leader
    assert at(leader, "tunefarm_measurements_total", kind="new") == 2
    assert at(leader, "tunefarm_measurements_total", kind="device_lost") == 1
    assert at(leader, "tunefarm_round_retries_total") == 1
    assert at(leader, "tunefarm_failed_candidates_total", **{"class": "build"}) == 2
    assert at(leader, "tunefarm_job_tasks", state="tuning") == 1
    assert at(leader, "tunefarm_best_latency_seconds", task="dense") == pytest.approx(25e-6)
    assert ("tunefarm_best_latency_seconds", frozenset(job | {("task", "relu")})) not in leader
    assert {dict(ls)["device_key"]: v for (n, ls), v in leader.items()
            if n == "tunefarm_rounds_queued"} == {"k": 3, "k2": 3}  # every live host's keys


def test_a_host_serves_its_own_phones_and_rounds_with_its_name(store):
    a_farm(store)
    for node, key, running in (("farm@a", "k", 1), ("farm@b", "k2", 0)):
        got = scrape(store, node, False)
        assert {dict(ls)["host"] for n, ls in got} == {node}
        phones = {dict(ls)["state"]: v for (n, ls), v in got.items() if n == "tunefarm_phones"}
        assert phones == {"free": 1, "busy": 1}, phones  # their sum: the phones
        assert got[("tunefarm_rounds_running", frozenset({("host", node),
                                                          ("device_key", key)}))] == running


def test_a_killed_workers_metric_files_are_removed_by_the_next(tmp_path, monkeypatch):
    """Round-time files live in <home>/metrics/<pid>: a worker killed before it could remove
    its folder leaves it, and the next worker of the machine removes it; a live one's stays."""
    import os
    import subprocess
    import sys

    from prometheus_client import values

    from workers.host.round_times import multiprocess_folder

    monkeypatch.setattr(values, "ValueClass", values.ValueClass)  # put back after the test
    # multiprocess_folder names it in os.environ: put back as it was (absent, in most runs),
    # else every later test's farm inherits a dead test's folder
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    live = str(os.getppid())
    for pid in (gone, live):
        (tmp_path / "metrics" / pid).mkdir(parents=True)
        (tmp_path / "metrics" / pid / "histogram_1.db").write_bytes(b"x")
    folder = multiprocess_folder(tmp_path)
    assert folder == str(tmp_path / "metrics" / str(os.getpid()))
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == folder
    assert sorted(p.name for p in (tmp_path / "metrics").iterdir()) == sorted(
        [live, str(os.getpid())])


def test_an_ended_jobs_series_outlive_it_for_a_while_then_end(store):
    """A scrape after the job ends still sees its final counts and tasks (else its last
    increments and its `done` never reach Prometheus); KEEP_ENDED_S later they end (else
    `job_id` grows without bound)."""
    from workers.host.metrics import KEEP_ENDED_S

    a_farm(store)
    now = [1000.0]
    collector = FarmCollector(store, Queues(), "farm@a", leads=lambda: True,  # type: ignore[arg-type]
                              clock=lambda: now[0])

    def job_series() -> dict[str, float]:
        return {f"{s.name}:{s.labels.get('state', s.labels.get('kind', ''))}": s.value
                for f in collector.collect() for s in f.samples
                if s.labels.get("job_id") == "j1"}

    assert job_series()["tunefarm_measurements_total:new"] == 2
    store.add_record(rec("c3", 30.0, wk="w1", job="j1"))  # its last measurement, then it ends
    for wk in ("w1", "w2"):
        store.set_task_state("j1", wk, TaskState(state="done"))
    store.set_active("j1", False)
    now[0] += 1.0
    after = job_series()
    assert after["tunefarm_measurements_total:new"] == 3 and after["tunefarm_job_tasks:done"] == 2
    now[0] += KEEP_ENDED_S - 2
    assert job_series()["tunefarm_job_tasks:done"] == 2
    now[0] += 3.0
    assert job_series() == {}
    store.set_active("j1", True)  # resumed: served again
    assert job_series()["tunefarm_job_tasks:done"] == 2
    other = FarmCollector(store, Queues(), "farm@b", leads=lambda: True)  # type: ignore[arg-type]
    store.set_active("j1", False)  # a collector that never saw it active does not serve it
    assert not any(s.labels.get("job_id") == "j1" for f in other.collect() for s in f.samples)
