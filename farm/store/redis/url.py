"""Redis connections from the farm's URLs (farm/core/urls.py): one Redis, or the primary
Sentinel names, followed across failovers. Only farm/store opens Redis connections."""

from __future__ import annotations

from farm.core.aliases import RedisClient
from farm.core.urls import is_sentinel, parse_sentinel


def client(url: str, decode: bool, socket_timeout: float = 30.0) -> RedisClient:
    """A redis-py client for the farm's URL (Sentinel: one that finds the primary again
    after a failover)."""
    import redis

    if not is_sentinel(url):
        return redis.Redis.from_url(url, decode_responses=decode, socket_connect_timeout=5,
                                    socket_timeout=socket_timeout, health_check_interval=10,
                                    retry_on_timeout=True)
    from redis.sentinel import Sentinel

    s = parse_sentinel(url)
    sentinel = Sentinel(list(s.sentinels), socket_connect_timeout=5,
                        sentinel_kwargs={"password": s.password, "socket_timeout": 5})
    return sentinel.master_for(s.master, db=s.db, password=s.password,
                               decode_responses=decode, socket_connect_timeout=5,
                               socket_timeout=socket_timeout, health_check_interval=10,
                               retry_on_timeout=True)
