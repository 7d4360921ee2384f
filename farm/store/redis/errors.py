"""The store's errors on Redis: redis-py's, translated where they leave the store.

Callers of the store catch the farm's own `StoreUnavailable` (farm/core/errors.py), whatever
the backend. The classes here are that, and still redis-py's errors, so the Redis backend's
own `except redis...` clauses and redis-py's machinery see what they always saw."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import redis

from farm.core.config import redact
from farm.core.errors import StoreUnavailable

T = TypeVar("T")


class RedisUnavailable(StoreUnavailable, redis.ConnectionError):
    """Redis unreachable or timing out, as the store raises it: the farm's StoreUnavailable,
    and still a redis-py ConnectionError to the backend's own code."""


class RedisFailed(StoreUnavailable, redis.RedisError):
    """Any other redis-py error leaving the store (a replica's READONLY, a server that
    cannot persist): the farm's StoreUnavailable, and still a redis-py RedisError."""


def _translating(method: Callable[..., Any], where: Callable[[Any], str]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except StoreUnavailable:
            raise  # a store method it called has said it already
        except (redis.ConnectionError, redis.TimeoutError) as e:
            raise RedisUnavailable(f"Redis is not reachable: {e}", subject=where(self),
                                   hint="the farm's Redis stopped or the network to it "
                                        "failed; a job goes on once it is back") from e
        except redis.RedisError as e:
            raise RedisFailed(f"Redis refused: {e}", subject=where(self)) from e

    return call


def translate_errors(cls: type[T]) -> type[T]:
    """Every public method of `cls` (a class through which calls enter the Redis backend, with
    a `url`: RedisStore, whose parts are reached only through it, BrokerQueues,
    SearchSessions) raises the farm's StoreUnavailable where redis-py raised (its methods'
    own `except redis...` inside, and the parts, see redis-py's errors as before)."""
    for name in dir(cls):
        attr = inspect.getattr_static(cls, name)
        if name.startswith("_") or not inspect.isfunction(attr):
            continue  # private, a property (r, rb), a static or class method, an attribute
        setattr(cls, name, _translating(attr, lambda owner: redact(owner.url)))
    return cls
