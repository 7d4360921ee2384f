"""The broker's queues of rounds, read: how deep a device key's queue is, which rounds wait
in it. The one place that knows how kombu's Redis transport keeps a queue (a Redis list per
priority step, named with kombu's private separator, messages as JSON with the task id in
their headers); farm/jobs/dispatch.py sends rounds, this only reads.

Thread safety: redis-py's client pools its connections; one `BrokerQueues` per process.
"""

from __future__ import annotations

import json

from farm.core import keys
from farm.core.aliases import RedisClient
from farm.core.messages import PRIORITIES
from farm.store.redis import url as redis_url
from farm.store.redis.errors import translate_errors

PRIORITY_STEPS = sorted(set(PRIORITIES.values()) | {9})  # kombu Redis: one list per step
_SEP = "\x06\x16"  # kombu's separator between a queue's name and its priority step


def queue_lists(queue: str) -> list[str]:
    """The Redis lists (full keys, with the farm's kombu prefix) that hold a queue's messages,
    one per priority step."""
    q = keys.celery_prefix() + queue
    return [q if step == 0 else f"{q}{_SEP}{step}" for step in PRIORITY_STEPS]


@translate_errors
class BrokerQueues:
    """Read-only view of the broker's queues (a Redis client made on first use)."""

    def __init__(self, url: str, client: RedisClient | None = None) -> None:
        self.url = url
        self._client = client

    @property
    def client(self) -> RedisClient:
        if self._client is None:
            self._client = redis_url.client(self.url, decode=True)
        return self._client

    def depth(self, queue: str) -> int:
        """Messages waiting in `queue` (all priorities)."""
        return sum(int(self.client.llen(name)) for name in queue_lists(queue))

    def task_ids(self, queue: str) -> set[str]:
        """The task ids of the messages waiting in `queue`; a message that is not readable
        JSON with an id in its headers is passed over."""
        found = set()
        for name in queue_lists(queue):
            for raw in self.client.lrange(name, 0, -1):
                try:
                    found.add(str(json.loads(raw)["headers"]["id"]))
                except (ValueError, KeyError, TypeError):
                    continue
        return found

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
