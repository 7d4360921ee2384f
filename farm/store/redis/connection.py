"""One Redis database as the store's parts share it (`RedisConnection`): its two clients,
the Lua scripts registered with them, and its URL. RedisStore (store.py) makes one and hands
it to each of its parts (records.py, spool.py, jobs.py, ...); nothing else opens it.

Thread safety: redis-py's clients pool their connections; the text client and its scripts
are made on first use and published as one, so a thread that sees the client has its scripts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from farm.core.aliases import RedisClient, RedisScript
from farm.core.config import redact
from farm.store.redis import url as redis_url


def lua_script(name: str) -> str:
    """A Lua script of the store, from this folder."""
    return Path(__file__).with_name(name).read_text()


_BEST = lua_script("best.lua")  # shared functions, prepended to the scripts that keep the best
KEEP_BEST = _BEST + lua_script("keep_best.lua")
REMOVE = _BEST + lua_script("remove_records.lua")
_LEASE = lua_script("lease.lua")
_RELEASE_LEASE = lua_script("release_lease.lua")
_FINISH_ROUND = lua_script("finish_round.lua")
_UNSPOOL = lua_script("unspool.lua")


@dataclass(frozen=True)
class Scripts:
    """The store's Lua scripts, registered with the text client (redis-py loads one on its
    first call, and again where the server lost it)."""

    keep_best: RedisScript  # a record's commit (best.lua + keep_best.lua): records.py
    remove: RedisScript  # records removed, the best recomputed: records.py
    lease: RedisScript  # take or renew a lease: coordination.py
    release: RedisScript  # give a lease back: coordination.py
    finish: RedisScript  # a round done and its fence released: coordination.py
    unspool: RedisScript  # a drained batch off the spool: spool.py

    @classmethod
    def registered(cls, client: RedisClient) -> Scripts:
        return cls(keep_best=client.register_script(KEEP_BEST),
                   remove=client.register_script(REMOVE),
                   lease=client.register_script(_LEASE),
                   release=client.register_script(_RELEASE_LEASE),
                   finish=client.register_script(_FINISH_ROUND),
                   unspool=client.register_script(_UNSPOOL))


class RedisConnection:
    """The clients of one Redis database (made on first use, made again after `close`), its
    scripts and its URL. Shared by the parts of one RedisStore."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.where = redact(url)  # the store as messages name it: no password
        self._text: tuple[RedisClient, Scripts] | None = None  # published as one
        self._bytes: RedisClient | None = None

    def _text_client(self) -> tuple[RedisClient, Scripts]:
        if self._text is None:
            client = redis_url.client(self.url, True)
            self._text = (client, Scripts.registered(client))
        return self._text

    @property
    def r(self) -> RedisClient:
        """The client (decode_responses: every reply is str, which redis-py's own types do not
        say, hence `RedisClient`)."""
        return self._text_client()[0]

    @property
    def rb(self) -> RedisClient:
        """A client whose replies are bytes: packed records, compressed texts."""
        if self._bytes is None:
            self._bytes = redis_url.client(self.url, False)
        return self._bytes

    @property
    def scripts(self) -> Scripts:
        """The scripts, registered with `r` (made with it)."""
        return self._text_client()[1]

    def close(self) -> None:
        if self._text is not None:
            self._text[0].close()
            self._text = None
        if self._bytes is not None:
            self._bytes.close()
            self._bytes = None
