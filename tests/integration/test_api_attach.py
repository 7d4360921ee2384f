"""The Python API on a lab farm of real parts (Redis, a tracker, an emulated phone, a Celery
worker): a job submitted without waiting is found again by its id from a fresh `farm.Farm`,
listed, cancelled (the store says so, and the farm stops measuring it) and resumed; and
`farm submit --no-wait --json` prints the job for a script to attach to."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import redis

import farm
from farm.devices.tracker import wait_for_phones
from farm.local import services
from farm.store import open_store
from tests.faults.conftest import tiny_model, wait_until
from tests.helpers import run_farm

pytestmark = pytest.mark.integration

HOST = "farm@attach"
FINISHED = ("done", "exhausted", "failed")


@pytest.fixture(scope="module")
def lab(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """One worker host: a tracker with one phone of key cpu-local, its worker on `redis_url`."""
    redis.Redis.from_url(redis_url).flushdb()
    logs = tmp_path_factory.mktemp("attach-logs")
    group = services.ServiceGroup()
    env = {"FARM_ROUND_TRIALS": "2"}
    try:
        svc, tracker = services.start_tracker(logs)
        group.add(svc)
        group.add(services.start_phone(tracker, "cpu-local", 0, logs))
        wait_for_phones(tracker, "cpu-local", 1, timeout_s=60)
        worker = group.add(services.start_worker(tracker, redis_url, logs, name="attach",
                                                 extra=["--hostname", HOST], env=dict(env)))
        store = open_store(redis_url)
        try:
            def beating() -> bool:
                assert worker.alive(), worker.log_tail(30)
                return any(h.name == HOST for h in store.hosts())

            wait_until(f"a heartbeat of {HOST}", beating, timeout_s=120)
        finally:
            store.close()
        yield {"redis": redis_url, "env": {"FARM_BROKER_URL": redis_url, **env}}
    finally:
        group.stop()


def job_state(redis_url: str, job_id: str) -> str | None:
    store = open_store(redis_url)
    try:
        return store.job_status(job_id).get("state")
    finally:
        store.close()


def test_a_job_is_attached_by_id_listed_cancelled_and_resumed(lab, tmp_path, monkeypatch):
    monkeypatch.setenv("FARM_HOME", str(tmp_path / "home"))
    model = tiny_model(tmp_path / "attach.pt2", width=23)
    # far more trials than the test waits for: the job is running when it is cancelled; in
    # short rounds (the lab's), as a round that has started runs to its end
    submitted = farm.Farm(broker=lab["redis"]).submit(model, out=tmp_path / "out",
                                                      trials_per_task=400, wait=False,
                                                      round_trials=2)
    assert submitted.summary is None

    fresh = farm.Farm(broker=lab["redis"])  # another process's view: only the id is shared
    job = fresh.job(submitted.job_id)
    assert job.job_id == submitted.job_id and job.out == (tmp_path / "out").resolve()
    status = job.status()
    assert status["status"]["state"] == "running" and len(status["tasks"]) == 2
    assert job.job_id in [v["job_id"] for v in fresh.jobs()]
    wait_until("a first measurement", lambda: job.progress().trials_done >= 1, timeout_s=300)

    job.cancel()
    assert job_state(lab["redis"], job.job_id) == "cancelled"
    progress = job.progress()
    assert progress.state == "cancelled"
    # the farm stops the job: its rounds end, and no trial is measured after that
    wait_until("every task of the cancelled job ended",
               lambda: all(t.state in FINISHED for t in job.progress().tasks), timeout_s=300)
    measured = job.progress().trials_done
    time.sleep(3)
    assert job.progress().trials_done == measured < 2 * 400

    again = job.resume(wait=False)  # as `farm resume JOB --no-wait`: run 2 of the same job
    assert again is job and job.summary is None
    assert job_state(lab["redis"], job.job_id) == "running"
    assert job.status()["run"] == 1
    job.cancel()
    assert job_state(lab["redis"], job.job_id) == "cancelled"


def test_an_attached_job_is_waited_for_with_progress_objects(lab, tmp_path, monkeypatch):
    """`farm wait JOB` from Python, in another Farm than the one that submitted: the waiting
    reports Progress objects and lines, then the job is finalized and compiled into its out."""
    monkeypatch.setenv("FARM_HOME", str(tmp_path / "home"))
    model = tiny_model(tmp_path / "wait.pt2", width=27)
    job_id = farm.Farm(broker=lab["redis"]).submit(model, out=tmp_path / "out",
                                                   trials_per_task=2, wait=False).job_id
    lines: list[str] = []
    seen: list[farm.Progress] = []
    summary = farm.Farm(broker=lab["redis"]).job(job_id).wait(
        timeout_s=600, report=lines.append, on_progress=seen.append)
    assert summary["job_id"] == job_id and summary["numerics_ok"]
    assert (tmp_path / "out" / "model.so").is_file()
    assert seen and seen[-1].tasks_finished == len(seen[-1].tasks) == len(summary["tasks"])
    assert [p.line for p in seen] == [line for line in lines if " tasks finished " in line]


def test_an_unknown_job_is_an_error_naming_it(lab, tmp_path, monkeypatch):
    monkeypatch.setenv("FARM_HOME", str(tmp_path / "home"))
    lab_farm = farm.Farm(broker=lab["redis"])
    with pytest.raises(farm.StoreError, match="job 19700101-000000-nojob: no such job"):
        lab_farm.job("19700101-000000-nojob")
    with pytest.raises(farm.FarmError, match="nojob"):
        farm.Job(lab_farm, "19700101-000000-nojob", None).cancel()


def test_submit_json_prints_the_job_for_a_script(lab, tmp_path):
    model = tiny_model(tmp_path / "json.pt2", width=29)
    proc = run_farm(["submit", str(model), "--out", str(tmp_path / "out"), "--no-wait",
                     "--trials-per-task", "400", "--json"], tmp_path, env=lab["env"],
                    timeout_s=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)  # stdout is the JSON alone; progress went to stderr
    assert got["out"] == str(tmp_path / "out") and "plan: job" in proc.stderr
    job = farm.Farm(broker=lab["redis"]).job(got["job_id"])
    assert job.status()["job_id"] == got["job_id"]
    job.cancel()
    assert job_state(lab["redis"], got["job_id"]) == "cancelled"
