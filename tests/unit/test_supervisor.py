"""The supervisor's judgement (which rounds are lost) and the round fence, on the in-memory
store; the real thing runs in tests/faults (killed hosts, Redis crashes, vanished messages)."""

from __future__ import annotations

import json
import time

from farm.core.messages import JobSpec, RoundRequest
from farm.jobs.dispatch import queue_for
from farm.jobs.fence import POISON_AFTER, RoundFence
from farm.jobs.supervisor import Supervisor
from farm.store import TaskState, open_store
from farm.store.broker import BrokerQueues, queue_lists


class App:
    """What the supervisor sends, instead of a broker."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def send_task(self, name, args, task_id, **_):  # noqa: ANN001 - Celery's signature
        self.sent.append(task_id)


class Lists:
    """A Redis client whose kombu list of key "k" holds the given task ids."""

    def __init__(self, queued: list[str] = ()) -> None:  # type: ignore[assignment]
        self.queued = [json.dumps({"headers": {"id": t}}) for t in queued]

    def lrange(self, name, start, end):  # noqa: ANN001
        return self.queued if name == queue_lists(queue_for("k"))[0] else []


def Broker(queued: list[str] = ()) -> BrokerQueues:  # type: ignore[assignment]  # noqa: N802
    """The broker adapter the supervisor reads, over those lists."""
    return BrokerQueues("redis://unused", client=Lists(queued))


def setup(states: dict[str, TaskState]):
    store = open_store("memory://")
    job = JobSpec(job_id="j", model="m", device_key="k", target={}, trials_per_task=8,
                  round_trials=4, workload_keys=list(states), task_names={}, weights={})
    store.put_job(job)
    store.set_job_status("j", state="running")
    store.set_active("j", True)
    for wk, st in states.items():
        store.set_task_state("j", wk, st)
    return store


def req(wk: str, attempt: int = 0) -> RoundRequest:
    return RoundRequest(job_id="j", workload_key=wk, task_name=wk, round_index=1, trials=4,
                        target_trials=8, max_rounds=4, device_key="k", attempt=attempt)


def queued(wk: str, age_s: float, state: str = "queued") -> TaskState:
    return TaskState(state=state, round=req(wk).to_json(), updated_at=time.time() - age_s)


def test_a_round_with_no_live_copy_is_sent_again_as_a_new_attempt():
    store = setup({"lost": queued("lost", 60), "running": queued("running", 60, "tuning"),
                   "in_queue": queued("in_queue", 60), "fresh": queued("fresh", 1),
                   "done": TaskState(state="done")})
    store.acquire_round(req("running").logical_id, "a|node|elsewhere|1", ttl_s=30)
    app = App()
    sup = Supervisor(app, store, Broker([req("in_queue").round_id]), "w", 5.0, grace_s=30.0)
    assert sup.sweep() == [req("lost", attempt=1).round_id]
    assert app.sent == [req("lost", attempt=1).round_id]
    st = store.task_states("j")["lost"]
    assert st.state == "queued" and st.round["attempt"] == 1
    # it never began: a retry of its own; "running" (a live copy elsewhere) is not one
    assert {wk: c["retries"] for wk, c in store.job_counts("j").items()} == {"lost": 1}
    assert sup.sweep() == []  # just sent: not again before the grace


def test_a_dead_holder_of_this_machine_is_not_a_live_copy():
    from farm.core.hostid import machine

    store = setup({"t": queued("t", 60, "tuning")})
    store.acquire_round(req("t").logical_id, f"x|node|{machine()}|999999", ttl_s=30)
    assert Supervisor(App(), store, Broker(), "w", 5.0, 30.0).sweep() != []
    # the same pid on a machine we cannot see into is alive until its lease expires
    store.set_task_state("j", "t", queued("t", 60, "tuning"))
    store.acquire_round(req("t").logical_id, "x|node|other~1|999999", ttl_s=30,
                        dead_holder=f"x|node|{machine()}|999999")
    assert Supervisor(App(), store, Broker(), "w", 5.0, 30.0).sweep() == []


def test_a_lost_round_that_began_tuning_counts_its_retry_where_it_begins_again():
    """The supervisor counts a retry only for a round that never began; one that began
    counts when its new copy begins tuning (workers/round/measure.py `_start`), so once."""
    from farm.core.hostid import machine

    store = setup({"t": queued("t", 60, "tuning")})
    assert store.round_tunings(req("t").logical_id, add=1) == 0  # the copy that died
    store.acquire_round(req("t").logical_id, f"x|node|{machine()}|999999", ttl_s=30)
    assert Supervisor(App(), store, Broker(), "w", 5.0, 30.0).sweep() != []
    assert store.job_counts("j") == {}
    assert store.round_tunings(req("t", attempt=1).logical_id, add=1) == 1  # a retry: counted


def test_a_finished_job_is_finalized_once_and_left_alone():
    store = setup({"a": TaskState(state="done"), "b": TaskState(state="failed")})
    Supervisor(App(), store, Broker(), "w", 5.0, 30.0).sweep()
    assert store.job_status("j")["state"] == "finalized"
    assert store.job_status("j")["finalized_by"] == "supervisor w"
    assert store.active_jobs() == []


def test_one_copy_runs_a_round_and_none_after_it_is_done():
    store = open_store("memory://")
    first = RoundFence(store, req("t"), "node1", ttl_s=30)
    assert first.enter() == "run"
    second = RoundFence(store, req("t", attempt=1), "node2", ttl_s=30)
    assert second.enter().startswith(req("t").round_id + "|node1|")  # the live holder
    first.exit(done=True)
    assert RoundFence(store, req("t", attempt=2), "node2", ttl_s=30).enter() == "done"


def test_a_round_whose_process_keeps_dying_is_poisoned():
    store = open_store("memory://")
    for _ in range(POISON_AFTER):
        fence = RoundFence(store, req("p"), "node", ttl_s=30)
        assert fence.enter() == "run" and not fence.poisoned
        store.release_round(req("p").logical_id, fence.owner)  # died: no exit(), lease gone
        fence._stop.set()
    last = RoundFence(store, req("p"), "node", ttl_s=30)
    assert last.enter() == "run" and last.poisoned and last.crashes == POISON_AFTER
    last.exit(done=True)


def test_a_copy_that_lost_its_fence_cannot_mark_the_round_done():
    """A copy whose lease expired (its host stalled) while a new copy took the round: when
    the stalled copy ends, it neither marks the round done nor moves the job on."""
    store = open_store("memory://")
    stalled = RoundFence(store, req("f"), "node1", ttl_s=0.2)
    assert stalled.enter() == "run"
    stalled._stop.set()  # it stalls: no renewal
    time.sleep(0.3)
    taker = RoundFence(store, req("f", attempt=1), "node2", ttl_s=30)
    assert taker.enter() == "run"
    assert stalled.exit(done=True) is False  # fenced out (its caller does not continue_job)
    assert not store.round_is_done(req("f").logical_id)
    assert taker.exit(done=True) is True
    assert store.round_is_done(req("f").logical_id)


def test_the_leader_moves_the_spool_to_the_archive_and_keeps_its_retention(tmp_path):
    from farm.core.messages import TuneTask
    from farm.store import StoredRecord
    from farm.store.cold import all_records

    store = open_store("memory://", hot_records=2, archive=str(tmp_path / "archive"))
    store.put_workload(TuneTask(name="t", workload_key="w", weight=1, mod_json="{}", target={},
                                device_key="k"))
    for i in range(5):
        store.add_record(StoredRecord(workload_key="w", candidate=f"c{i}", record=[[], [], {}, []],
                                      run_us=1.0 + i, measured_at=time.time()))
    old = tmp_path / "archive" / "k" / "2001-01-01"
    old.mkdir(parents=True)
    sup = Supervisor(App(), store, Broker(), node="n", interval_s=1, grace_s=1)
    sup.retention_days = 30
    assert sup.keep_archive() == 3
    assert store.spool_size() == 0 and len(all_records(store, store.archive, "w")) == 5
    assert not old.exists()  # a day past the retention is deleted
    assert sup.keep_archive() == 0
