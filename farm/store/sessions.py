"""A round's search lent to a helper host: the Redis side of a search session.

The phone host that runs a round (the owner) opens a session; a helper host (`farm worker
--helper`, no phones) claims it, searches and builds the round's batches and pushes each
one, the built kernels inside; the owner measures a batch on its phones, commits the records
as any round does, and pushes the batch's results back, which the helper tells its search
before it proposes the next batch but one (workers/round/lend/helper_side.py, workers/round/lend/phone_side.py).

Both sides beat while they work (a key that expires `ttl_s` after the last beat): the owner
finishes the round itself when the helper's beat is gone, the helper stops when the owner's
is. Contract: `claim` succeeds for one helper only, and never on a closed session; a closed
session takes no more batches or results (pushes are dropped); every key of a session
expires on its own (SESSION_TTL_S) should both sides die.

The farm's helpers serve so many sessions at once (their heartbeats say how many); `open`
admits a session only while fewer are open (a sorted set of the open sessions, each until
its owner's beat expires, kept with Redis's clock), so a round never waits for a helper that
has no room: it searches on its own host instead. A session's id begins with its owner's name
(`session_id`), so an owner counts its own.
"""

from __future__ import annotations

from farm.core import keys
from farm.core.aliases import RedisClient
from farm.store.redis import url as redis_url
from farm.store.redis.errors import translate_errors

SESSION_TTL_S = 3600  # a session's keys are gone this long after its last write

# open: the owner's first beat and the session among the open ones, while fewer than the
# helpers' room are open (room < 0: no limit); Redis's clock, the same for every host
_OPEN = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if tonumber(ARGV[3]) >= 0 and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[4])
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[2])
return 1
"""
# the owner's beat: its key, and the session kept open as long (unless closed meanwhile)
_BEAT_OWNER = """
local t = redis.call('TIME')
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[2])
if redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('ZADD', KEYS[1], 'XX', tonumber(t[1]) + tonumber(ARGV[2]), ARGV[3])
end
return 1
"""
_OPEN_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""

# claim: the helper key, set only when the session is open and nobody holds it
_CLAIM = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then return 1 end
return 0
"""
# push: to a list of an open session only
_PUSH = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""


@translate_errors
class SearchSessions:
    """Search sessions on the farm's Redis (binary values: a batch carries built kernels)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._r: RedisClient = None

    @property
    def r(self) -> RedisClient:
        if self._r is None:
            self._r = redis_url.client(self.url, decode=False)
        return self._r

    @staticmethod
    def session_id(owner: str, round_id: str, nonce: str) -> str:
        return f"{owner}/{round_id}/{nonce}"

    def open(self, sid: str, owner: str, ttl_s: float, room: int = -1) -> bool:
        """The owner opens the session (its first beat): True unless `room` sessions (>= 0)
        are open already."""
        return bool(self.r.eval(_OPEN, 2, keys.search_open(), keys.search_session(sid, "owner"),
                                owner, max(1, int(ttl_s)), int(room), sid))

    def open_now(self) -> list[str]:
        """The open sessions' ids (an owner gone silent is not counted after its beat)."""
        return [m.decode() for m in self.r.eval(_OPEN_NOW, 1, keys.search_open())]

    def claim(self, sid: str, helper: str, ttl_s: float) -> bool:
        """The helper takes the session: True for the first helper, while it is open."""
        return bool(self.r.eval(_CLAIM, 2, keys.search_session(sid, "helper"),
                                keys.search_session(sid, "closed"), helper, int(ttl_s)))

    def beat(self, sid: str, side: str, name: str, ttl_s: float) -> None:
        """`side` ("owner" or "helper") is alive for `ttl_s` more."""
        if side == "owner":
            self.r.eval(_BEAT_OWNER, 3, keys.search_open(), keys.search_session(sid, side),
                        keys.search_session(sid, "closed"), name, max(1, int(ttl_s)), sid)
            return
        self.r.set(keys.search_session(sid, side), name, ex=max(1, int(ttl_s)))

    def holder(self, sid: str, side: str) -> str | None:
        """Who beats for `side`, None when its beat expired (or it never began)."""
        got = self.r.get(keys.search_session(sid, side))
        return got.decode() if got is not None else None

    def close(self, sid: str, why: str) -> None:
        """The session ends (either side); its lists go."""
        self.r.set(keys.search_session(sid, "closed"), why, ex=SESSION_TTL_S)
        self.r.delete(keys.search_session(sid, "batches"), keys.search_session(sid, "results"))
        self.r.zrem(keys.search_open(), sid)

    def closed(self, sid: str) -> str | None:
        """Why the session ended, None while it is open."""
        got = self.r.get(keys.search_session(sid, "closed"))
        return got.decode() if got is not None else None

    def push(self, sid: str, part: str, blob: bytes) -> bool:
        """A batch ("batches") or its results ("results") to the other side; False when the
        session is closed."""
        return bool(self.r.eval(_PUSH, 2, keys.search_session(sid, part),
                                keys.search_session(sid, "closed"), blob, SESSION_TTL_S))

    def pop(self, sid: str, part: str, timeout_s: float) -> bytes | None:
        """The next item of `part`, waiting up to `timeout_s` (None: nothing came)."""
        got = self.r.blpop([keys.search_session(sid, part)], timeout=max(1, int(timeout_s)))
        return got[1] if got else None
