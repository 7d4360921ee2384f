"""The record store: every measurement, keyed by workload key; the farm's checkpoint."""

from farm.store.store import RecordStore, StoredRecord, TaskState, candidate_hash, is_better

__all__ = ["RecordStore", "StoredRecord", "TaskState", "candidate_hash", "is_better", "open_store"]


def open_store(url: str | None) -> RecordStore:
    """A Redis store for `url`, or an in-memory one for `memory://` (tests, dry runs)."""
    if url is None or url.startswith("memory://"):
        from farm.store.memory_store import MemoryStore

        return MemoryStore()
    from farm.store.redis_store import RedisStore

    return RedisStore(url)
