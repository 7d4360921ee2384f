"""The phones' ledger on Redis (farm/store/phones.py says what it keeps): `RedisPhoneLedger`,
a part of RedisStore (store.py), on the store's connection (connection.py)."""

from __future__ import annotations

import json
import zlib

from farm.core import keys
from farm.store.phones import (
    SPANS_KEPT,
    PhoneLedger,
    PhoneSpan,
    PhoneStat,
    heat_verdict,
    phone_stat,
)
from farm.store.redis.connection import RedisConnection


class RedisPhoneLedger(PhoneLedger):
    """The phones' ledger of RedisStore."""

    def __init__(self, conn: RedisConnection) -> None:
        self.conn = conn

    def note_phone_spans(self, spans: list[PhoneSpan]) -> None:
        if not spans:
            return
        pipe = self.conn.r.pipeline()
        for sp in spans:
            hkey = keys.phone(sp.key, sp.phone)
            pipe.sadd(keys.phone_index(), f"{sp.key}|{sp.phone}")
            pipe.hincrbyfloat(hkey, "busy_s", sp.seconds)
            pipe.hincrby(hkey, "measurements", 1)
            if sp.outcome == "device_lost":
                pipe.hincrby(hkey, "device_lost", 1)
            pipe.hset(hkey, mapping={"worker": sp.worker, "last_at": repr(sp.end)})
        pipe.execute()
        # a batch's spans as one compressed item: they repeat their job, task, round and
        # phones (~360 bytes of JSON a span as items of their own, a fifth of it so)
        pipe = self.conn.rb.pipeline()
        for job_id in {sp.job_id for sp in spans}:
            mine = [sp.to_json() for sp in spans if sp.job_id == job_id]
            pipe.rpush(keys.job_phone_spans(job_id),
                       zlib.compress(json.dumps(mine, separators=(",", ":")).encode(), 6))
            pipe.ltrim(keys.job_phone_spans(job_id), -SPANS_KEPT // 4, -1)
            pipe.expire(keys.job_phone_spans(job_id), keys.JOB_TTL_S)
        pipe.execute()

    def add_phone_work(self, key: str, phone: str, worker: str, seconds: float) -> None:
        pipe = self.conn.r.pipeline()
        pipe.sadd(keys.phone_index(), f"{key}|{phone}")
        pipe.hincrbyfloat(keys.phone(key, phone), "work_s", seconds)
        pipe.hset(keys.phone(key, phone), "worker", worker)
        pipe.execute()

    def phone_lost(self, key: str, phone: str, at: float, window_s: float, limit: int,
                   aside_s: float) -> float:
        losses = keys.phone_losses(key, phone)
        pipe = self.conn.r.pipeline()
        pipe.zadd(losses, {repr(at): at})
        pipe.zremrangebyscore(losses, "-inf", at - window_s)
        pipe.zcard(losses)
        pipe.expire(losses, max(1, round(window_s)))
        if pipe.execute()[2] < limit:
            return 0.0
        until = at + aside_s
        pipe = self.conn.r.pipeline()
        pipe.sadd(keys.phone_index(), f"{key}|{phone}")
        pipe.hset(keys.phone(key, phone), mapping={"aside_until": repr(until), "aside_why": "lost"})
        pipe.delete(losses)
        pipe.execute()
        return until

    def phone_heat(self, key: str, phone: str, us: float, at: float, share: float,
                   rest_s: float) -> tuple[bool, float, float]:
        # read, decide, write: a phone's readings come from the one host whose tracker holds
        # it, one session at a time, so two readings of a phone do not race
        hkey = keys.phone(key, phone)
        hot, base, cool_at, fields = heat_verdict(self.conn.r.hgetall(hkey), us, at, share,
                                                  rest_s)
        pipe = self.conn.r.pipeline()
        pipe.sadd(keys.phone_index(), f"{key}|{phone}")
        pipe.hset(hkey, mapping=fields)
        pipe.execute()
        return hot, base, cool_at

    def phone_stats(self) -> list[PhoneStat]:
        members = sorted(self.conn.r.smembers(keys.phone_index()))
        pipe = self.conn.r.pipeline()
        for m in members:
            pipe.hgetall(keys.phone(*m.split("|", 1)))
        return [phone_stat(m, raw) for m, raw in zip(members, pipe.execute(), strict=True)]

    def job_phone_spans(self, job_id: str) -> list[PhoneSpan]:
        out = []
        for item in self.conn.rb.lrange(keys.job_phone_spans(job_id), 0, -1):
            if item[:1] == b"{":  # one span as JSON (a store written before)
                out.append(PhoneSpan.loads(item.decode()))
            else:
                out.extend(PhoneSpan.from_json(d) for d in json.loads(zlib.decompress(item)))
        return out
