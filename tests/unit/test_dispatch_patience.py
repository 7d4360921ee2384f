"""`farm submit` sends a job's first rounds through a store or broker restart (farm/pipeline/job.py:
send_first_rounds): the client waits for them instead of dying with the job half sent. Before,
a Redis restarted while the client sent the rounds ended `farm submit` with the connection's
error (a clean-clone run of 2026-12-07)."""

from __future__ import annotations

import types

import pytest
from kombu.exceptions import OperationalError

from farm.core.messages import JobSpec, TuneTask
from farm.jobs.plan import TaskPlan
from farm.pipeline import job as job_stage
from farm.store import StoreUnavailable, open_store


class Flaky:
    """The store, whose `method` fails `times` times first (a Redis restarting)."""

    def __init__(self, store: object, method: str, times: int) -> None:
        self.store, self.method, self.left = store, method, times

    def __getattr__(self, name: str) -> object:
        real = getattr(self.store, name)
        if name != self.method:
            return real

        def call(*args: object, **kwargs: object) -> object:
            if self.left > 0:
                self.left -= 1
                raise StoreUnavailable("Connection refused")  # as every backend raises it
            return real(*args, **kwargs)

        return call


class Broker:
    """Celery's send_task, failing `times` times first (kombu's error for a broker away)."""

    def __init__(self, times: int) -> None:
        self.left, self.sent = times, []

    def send_task(self, name: str, args: list, **kwargs: object) -> None:
        if self.left > 0:
            self.left -= 1
            raise OperationalError("Error 111 connecting to 127.0.0.1:6390. Connection refused.")
        self.sent.append(kwargs["task_id"])


def plans(n: int) -> tuple[JobSpec, list[TaskPlan]]:
    tasks = [TuneTask(name=f"t{i}", workload_key=f"w{i}", weight=1, mod_json="{}", target={},
                      device_key="k") for i in range(n)]
    job = JobSpec(job_id="j", model="m", device_key="k", target={}, trials_per_task=8,
                  round_trials=8, workload_keys=[t.workload_key for t in tasks],
                  task_names={t.workload_key: t.name for t in tasks},
                  weights={t.workload_key: 1 for t in tasks}, max_rounds=4)
    return job, [TaskPlan(task=t, in_store=0, needed=8, max_rounds=4) for t in tasks]


@pytest.mark.parametrize("store_fails, broker_fails", [(2, 0), (0, 2), (1, 1)])
def test_first_rounds_are_sent_through_a_restart(monkeypatch, store_fails, broker_fails):
    monkeypatch.setattr(job_stage.time, "sleep", lambda s: None)
    store = open_store("memory://")
    job, todo = plans(3)
    farm = types.SimpleNamespace(store=Flaky(store, "set_task_state", store_fails),
                                 app=Broker(broker_fails))
    job_stage.send_first_rounds(farm, job, todo, 8)
    assert len(farm.app.sent) == 3 == len(set(farm.app.sent))  # every task's first round, once
    assert {store.task_states("j")[f"w{i}"].state for i in range(3)} == {"queued"}


def test_a_store_away_longer_than_the_patience_is_the_error(monkeypatch):
    clock = iter(range(0, 10_000, 7))
    monkeypatch.setattr(job_stage.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(job_stage.time, "sleep", lambda s: None)
    job, todo = plans(1)
    farm = types.SimpleNamespace(store=Flaky(open_store("memory://"), "put_workload", 10**6),
                                 app=Broker(0))
    with pytest.raises(StoreUnavailable):
        job_stage.send_first_rounds(farm, job, todo, 8)
    assert farm.app.sent == []
