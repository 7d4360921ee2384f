"""The record store: every measurement, keyed by workload key; the farm's checkpoint."""

from typing import Any

from redis import RedisError as StoreUnavailable

from farm.store.store import RecordStore, StoredRecord, TaskState, candidate_hash, is_better

__all__ = ["RecordStore", "StoreUnavailable", "StoredRecord", "TaskState", "candidate_hash",
           "is_better", "open_broker", "open_store"]


def open_store(url: str | None) -> RecordStore:
    """A Redis store for `url`, or an in-memory one for `memory://` (tests, dry runs)."""
    if url is None or url.startswith("memory://"):
        from farm.store.memory_store import MemoryStore

        return MemoryStore()
    from farm.store.redis_store import RedisStore

    return RedisStore(url)


def open_broker(url: str) -> Any:
    """A Redis client of the broker, to read its queue lists (farm/jobs/dispatch.py reads
    them by the names kombu gives them). Only farm/store/ opens Redis connections."""
    import redis

    return redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=5,
                                socket_timeout=30)
