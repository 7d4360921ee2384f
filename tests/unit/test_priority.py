"""--priority: the broker hands out queued rounds of a higher priority first (real Redis, the
farm's own Celery app and kombu transport settings)."""

from __future__ import annotations

from farm.core.config import load_config
from farm.core.messages import PRIORITIES, RoundRequest
from farm.jobs.dispatch import make_app, queue_for, queued_rounds, send_round
from farm.store import open_broker


def round_of(job: str, priority: str, i: int) -> RoundRequest:
    return RoundRequest(job_id=job, workload_key=f"wk{i}", task_name=f"t{i}", round_index=0,
                        trials=1, target_trials=1, max_rounds=1, device_key="prio",
                        priority=PRIORITIES[priority])


def test_high_priority_rounds_are_served_first(clean_redis):

    app = make_app(load_config({"broker_url": clean_redis}))
    for i in range(3):
        send_round(app, round_of("low-job", "low", i))
    for i in range(3):
        send_round(app, round_of("normal-job", "normal", i))
    send_round(app, round_of("urgent-job", "high", 0))
    assert queued_rounds(open_broker(clean_redis), "prio") == 7

    from kombu import Queue

    order = []
    with app.connection_for_read() as conn:
        with conn.SimpleQueue(Queue(queue_for("prio"), routing_key=queue_for("prio"))) as q:
            for _ in range(7):
                msg = q.get(timeout=10)
                args, _kwargs, _embed = msg.payload  # Celery's message protocol 2
                order.append(args[0]["job_id"])
                msg.ack()
    assert order == ["urgent-job"] + ["normal-job"] * 3 + ["low-job"] * 3
