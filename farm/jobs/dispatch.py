"""Stage 4, dispatch: the Celery app both sides share, and sending rounds to device-key queues.

Messages are JSON only (workers never unpickle), at-least-once (acks_late,
reject_on_worker_lost, prefetch 1), and the broker's visibility timeout is
sized to a round, not to a job.
"""

from __future__ import annotations

from farm.core import keys
from farm.core.aliases import CeleryApp
from farm.core.config import FarmConfig
from farm.core.messages import PRIORITIES, RoundRequest, logical_of
from farm.core.urls import celery_broker
from farm.store.broker import PRIORITY_STEPS, BrokerQueues

ROUND_TASK = "tunefarm.round"
# a round's search and builds lent to a helper host (workers/round/lend/helper_side.py): its queue
SEARCH_TASK = "tunefarm.search"
SEARCH_QUEUE = "tune.search"


def queue_for(device_key: str) -> str:
    """The Celery queue of a device key: only hosts with phones of that key consume it."""
    return f"tune.{device_key}"


def queued_rounds(broker: BrokerQueues, device_key: str) -> int:
    """Rounds waiting in the broker for a phone of `device_key` (all priorities)."""
    return broker.depth(queue_for(device_key))


def queued_round_ids(broker: BrokerQueues, device_key: str) -> set[str]:
    """Logical ids of the rounds waiting in the broker for a phone of `device_key`."""
    return {logical_of(task_id) for task_id in broker.task_ids(queue_for(device_key))}


def make_app(config: FarmConfig, broker_url: str | None = None) -> CeleryApp:
    """The Celery app for a farm (broker = `broker_url` or the config's)."""
    from celery import Celery

    broker, sentinel = celery_broker(str(broker_url or config.broker_url))
    backend, backend_sentinel = celery_broker(str(config.store_url or broker_url
                                                  or config.broker_url))
    app = Celery("tunefarm", broker=broker, backend=backend)
    # every key of kombu's and of the result backend under the farm's prefix (global_keyprefix)
    visibility = {"visibility_timeout": int(config.round_timeout_s),
                  "global_keyprefix": keys.celery_prefix()}
    transport = {**visibility, "priority_steps": PRIORITY_STEPS, **sentinel}
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        event_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_transport_options=transport,
        result_backend_transport_options={**visibility, **backend_sentinel},
        worker_cancel_long_running_tasks_on_connection_loss=True,
        worker_deduplicate_successful_tasks=True,
        task_track_started=True,
        worker_send_task_events=True,
        task_send_sent_event=True,
        broker_connection_retry_on_startup=True,
        worker_proc_alive_timeout=300.0,  # a pool child warms TVM (~15 s) before it is ready
        result_expires=7 * 24 * 3600,
        task_default_queue="tune.default",
        task_default_priority=PRIORITIES["normal"],
        worker_hijack_root_logger=False,
    )
    return app


def send_round(app: CeleryApp, req: RoundRequest, countdown_s: float | None = None) -> None:
    """Queue one round on its device key's queue. The task id is the round id (dedupe)."""
    app.send_task(
        ROUND_TASK, args=[req.to_json()], queue=queue_for(req.device_key), task_id=req.round_id,
        shadow=f"{req.model}:{req.task_name} round {req.round_index + 1} [{req.device_key}]",
        countdown=countdown_s, priority=req.priority,
    )
