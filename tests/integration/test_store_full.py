"""A full store refuses a record with a clear error (noeviction), and never drops one."""

from __future__ import annotations

import pytest
import redis

from farm.core.errors import StoreError
from farm.local import services
from farm.store import StoredRecord, open_store

pytestmark = pytest.mark.integration


def test_a_full_store_says_so_and_keeps_what_it_has(tmp_path):
    svc, url = services.start_redis(tmp_path / "redis", tmp_path, maxmemory="2mb")
    try:
        store = open_store(url)
        filler = redis.Redis.from_url(url)
        kept = 0
        with pytest.raises(StoreError, match="the store is full") as err:
            for i in range(100000):
                store.add_record(StoredRecord(
                    workload_key="wk", candidate=f"c{i}", record=[{"t": "x" * 2000}, [1.0], {}, []],
                    run_us=1.0 + i, job_id="j"))
                kept += 1
        assert "FARM_REDIS_MAXMEMORY" in str(err.value)
        assert kept > 10 and store.record_count("wk") == kept  # nothing evicted
        assert filler.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        assert filler.config_get("appendfsync")["appendfsync"] == "always"
    finally:
        svc.stop()
