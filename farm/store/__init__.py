"""The record store: every measurement, keyed by workload key; the farm's checkpoint."""


from redis import RedisError as StoreUnavailable

from farm.store.broker import BrokerQueues
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


def open_broker(url: str) -> BrokerQueues:
    """The broker's queues of rounds, read-only (farm/store/broker.py). Only farm/store/
    opens Redis connections."""
    return BrokerQueues(url)
