"""The record store: every measurement, keyed by workload key; the farm's checkpoint.

Its errors are the farm's own (farm/core/errors.py): `StoreUnavailable` (a ServiceError: the
backend failed an operation; worth a retry) and `StoreError` (a record or job missing or
corrupt), whatever the backend."""

# Imports inside functions: a backend is loaded when a store of its kind is opened
# (a process with the in-memory store loads no Redis backend, the archive only with one).

from farm.core.config import FarmConfig
from farm.core.errors import StoreUnavailable
from farm.store.broker import BrokerQueues
from farm.store.store import (
    HOT_RECORDS,
    RecordStore,
    StoredRecord,
    TaskState,
    candidate_hash,
    is_better,
)

__all__ = ["RecordStore", "StoreUnavailable", "StoredRecord", "TaskState", "candidate_hash",
           "configured_store", "is_better", "open_broker", "open_store"]


def open_store(url: str | None, hot_records: int = HOT_RECORDS,
               archive: str | None = None, features: str | None = None) -> RecordStore:
    """A Redis store for `url`, or an in-memory one for `memory://` (tests, dry runs).
    `hot_records`: whole records a workload keeps in Redis; `archive`: where the others
    are read from (a folder or fsspec URL; farm/store/cold.py), None: Redis's only;
    `features`: the host's file of cost-model features (farm/store/features.py), None: in
    the store."""
    from farm.store.cold import Archive
    from farm.store.features import LocalFeatures

    cold = Archive(archive) if archive else None
    local = LocalFeatures(features) if features else None
    if url is None or url.startswith("memory://"):
        from farm.store.memory.store import MemoryStore

        return MemoryStore(hot_records, cold)  # features in memory: one process
    from farm.store.redis.store import RedisStore

    return RedisStore(url, hot_records, cold, local)


def configured_store(config: FarmConfig, url: str | None = None) -> RecordStore:
    """The store as every process of the farm opens it: at `url` (default: the config's),
    with the config's hot records and archive."""
    return open_store(url or config.store_url, config.hot_records, config.archive_url,
                      str(config.home / "features.sqlite"))


def open_broker(url: str) -> BrokerQueues:
    """The broker's queues of rounds, read-only (farm/store/broker.py). Only farm/store/
    opens Redis connections."""
    return BrokerQueues(url)
