"""Workloads, records, features and cost models on Redis, compactly (farm/store/packing.py):
`RedisRecords`, a part of RedisStore (store.py), on the store's connection (connection.py).

Per workload: an entry for every candidate ever measured (`records`), the K fastest whole
records packed (`hot`; the slowest leaves when a K+1st comes), the best, and the workload's TIR compressed.
The commit (keep_best.lua) pushes a whole record leaving the K onto the spool, atomically;
farm/store/cold.py drains it into the archive.
"""

from __future__ import annotations

import logging
import time
import uuid
import zlib
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis

from farm.core import keys
from farm.core.errors import StoreError
from farm.core.messages import TuneTask
from farm.store.learned import model_key
from farm.store.packing import (
    dictionary_id,
    entry_of,
    pack,
    pack_features,
    parse_entry,
    squeeze,
    unpack_features,
    unpack_text,
    unsqueeze,
    unsqueeze_bytes,
    zdict_of,
)
from farm.store.redis.connection import RedisConnection
from farm.store.store import HOT_RECORDS, Entry, StoredRecord, check_run_us, on_phone

if TYPE_CHECKING:
    from farm.store.features import LocalFeatures

log = logging.getLogger(__name__)

REPLICAS_READ_S = 10.0  # how often a client asks the primary how many replicas it has
REPLICA_WAIT_S = 2.0  # how long a commit waits for one replica's acknowledgment
_FULL = ("the store is full (Redis maxmemory reached, it evicts nothing)",
         "records so far are kept; raise maxmemory (FARM_REDIS_MAXMEMORY or redis.conf), "
         "then `farm resume` the job")

# a whole record read from the archive (workload key, candidate hash; None: not there, or the
# store has no archive): the store's, which drains the spool first under its lease
FromArchive = Callable[[str, str], StoredRecord | None]


@dataclass
class Replicas:
    """What a client last read of the primary's replicas (`_replicated`)."""

    count: int = 0
    read_at: float = -1e9
    warned_at: float = -1e9


class RedisRecords:
    """The records of RedisStore, with their workloads, features and cost models (its
    `RecordReader`, `RecordWriter` and `LearnedStore`), on the store's connection.
    `hot_records` whole records per workload stay in Redis, the others leave for the archive
    and are read back through `from_archive`; `local_features`: the host's file of features
    (farm/store/features.py), None: in Redis."""

    def __init__(self, conn: RedisConnection, from_archive: FromArchive,
                 hot_records: int = HOT_RECORDS,
                 local_features: LocalFeatures | None = None) -> None:
        self.conn = conn
        self.hot_records = hot_records
        self.from_archive = from_archive
        self.local_features = local_features
        self._zdict_cache: dict[str, bytes] = {}  # workload key -> its dictionary, read once
        self._replicas = Replicas()

    def _zdict(self, wk: str, rec: StoredRecord | None = None) -> bytes | None:
        """The workload's dictionary (set once, by its first record)."""
        cache = self._zdict_cache
        if wk in cache:
            return cache[wk]
        raw = self.conn.rb.hget(keys.workload(wk), "zdict")
        model = zdict_of(rec) if raw is None and rec is not None else None
        if model is not None:
            self.conn.rb.hsetnx(keys.workload(wk), "zdict", squeeze(model))
            raw = self.conn.rb.hget(keys.workload(wk), "zdict")
        if raw is None:
            return None  # none yet: records are packed alone until one is set
        cache[wk] = unsqueeze_bytes(raw)
        return cache[wk]

    # --- workloads -------------------------------------------------------------
    def put_workload(self, task: TuneTask, job_id: str = "") -> bool:
        mkey = model_key(task.device_key, task.target)
        self.conn.r.sadd(keys.model_workloads(mkey), task.workload_key)
        if task.family:
            self.conn.r.hset(keys.model_families(mkey), task.workload_key, task.family)
        new = bool(self.conn.rb.hsetnx(keys.workload(task.workload_key), "task",
                                       squeeze(task.dumps())))
        if new:
            self.conn.r.hset(keys.workload(task.workload_key),
                             mapping={"first_job": job_id, "created_at": str(time.time())})
            self.conn.r.zadd(keys.workload_index(), {task.workload_key: time.time()}, nx=True)
        return new

    def get_workload(self, wk: str) -> TuneTask | None:
        raw = self.conn.rb.hget(keys.workload(wk), "task")
        return None if raw is None else TuneTask.loads(unsqueeze(raw))

    def workload_keys(self) -> list[str]:
        return list(self.conn.r.zrange(keys.workload_index(), 0, -1))

    def model_workloads(self, mkey: str) -> list[str]:
        return sorted(self.conn.r.smembers(keys.model_workloads(mkey)))

    def model_families(self, mkey: str) -> dict[str, str]:
        return dict(self.conn.r.hgetall(keys.model_families(mkey)))

    def put_features(self, wk: str, features: dict[str, str]) -> None:
        if self.local_features is not None:  # the host's disk, not Redis (features.py)
            self.local_features.put(wk, features)
        elif features:  # float16 bytes (packing.pack_features)
            self.conn.rb.hset(keys.features(wk), mapping={k: pack_features(v)
                                                          for k, v in features.items()})

    def features(self, wk: str) -> dict[str, str]:
        if self.local_features is not None:
            return self.local_features.get(wk)
        return {k.decode(): unpack_features(v)
                for k, v in self.conn.rb.hgetall(keys.features(wk)).items()}

    def put_cost_model(self, mkey: str, fields: dict[str, str]) -> None:
        pipe = self.conn.rb.pipeline(transaction=True)
        pipe.delete(keys.cost_model(mkey))
        if fields:
            pipe.hset(keys.cost_model(mkey), mapping={k: squeeze(v) if k == "booster" else v
                                                      for k, v in fields.items()})
        pipe.execute()

    def cost_model(self, mkey: str) -> dict[str, str]:
        return {k.decode(): unsqueeze(v)
                for k, v in self.conn.rb.hgetall(keys.cost_model(mkey)).items()}

    # --- records ----------------------------------------------------------------
    def add_record(self, rec: StoredRecord) -> bool:
        check_run_us(rec)
        wk = rec.workload_key
        run_us = "" if not rec.valid else repr(float(rec.run_us))  # type: ignore[arg-type]
        zdict = self._zdict(wk, rec)
        attempt = uuid.uuid4().hex[:16]  # the same when the commit is sent again
        names = [keys.records(wk), keys.best(wk),
                 keys.job_measured(rec.job_id) if rec.job_id else "",
                 keys.job_counts(rec.job_id) if rec.job_id else "", keys.unverified(wk),
                 keys.hot(wk), keys.spool(), keys.commit_attempt(attempt)]
        args: list[str | bytes] = [
            rec.candidate, entry_of(rec), pack(rec, zdict), run_us, wk,
            "1" if on_phone(rec) else "0", "1" if rec.verified else "0", rec.tvm,
            str(max(1, self.hot_records)), str(keys.COMMIT_TTL_S)]
        try:
            try:
                return self._send_commit(names, args)
            except redis.exceptions.NoScriptError:
                # a failover's new primary has not loaded the script: the pipeline loads it
                # again, and the attempt id keeps a commit that did run from counting twice
                return self._send_commit(names, args)
        except redis.exceptions.OutOfMemoryError as e:
            raise StoreError(f"{_FULL[0]}: {e}", subject=f"{self.conn.where}, workload {wk}",
                             hint=_FULL[1]) from e
        except redis.exceptions.ResponseError as e:  # after OOM: its subclass
            if "refused" not in str(e):
                raise
            raise StoreError(str(e), subject=f"record {rec.candidate} of workload {wk}") from e

    def _send_commit(self, names: list[str], args: list[str | bytes]) -> bool:
        """keep_best.lua and, where the primary has replicas, its WAIT on one connection (a
        pipeline's): WAIT counts the replicas that have this connection's writes, so on
        another connection it proves nothing."""
        pipe = self.conn.r.pipeline(transaction=False)
        self.conn.scripts.keep_best(keys=names, args=args, client=pipe)
        replicas = self._replica_count()
        if replicas:
            pipe.wait(1, int(REPLICA_WAIT_S * 1000))
        answers = pipe.execute()
        if replicas:
            self._replicated(int(answers[1]), replicas)
        return bool(answers[0])

    def _replica_count(self) -> int:
        """The primary's replicas, read again every REPLICAS_READ_S. Where it has one, a
        commit returns once one replica has it too (WAIT): a failover (Sentinel) then loses
        no record a round was told is stored."""
        now, seen = time.monotonic(), self._replicas
        if now - seen.read_at > REPLICAS_READ_S:
            seen.count = int(self.conn.r.info("replication").get("connected_slaves", 0))
            seen.read_at = now
        return seen.count

    def _replicated(self, acknowledged: int, replicas: int) -> None:
        now, seen = time.monotonic(), self._replicas
        if acknowledged < 1 and now - seen.warned_at > 60:
            seen.warned_at = now
            log.warning("store: no replica acknowledged a record within %.0f s (replicas: "
                        "%d); the record is on the primary only", REPLICA_WAIT_S, replicas)

    def record_text(self, wk: str, blob: bytes) -> str:
        """A whole record's JSON from its packed blob, unpacked with the dictionary whose id
        the blob names (zlib's header): a dictionary cached before is read again when it is
        not that one. Raises when the record cannot be read."""
        zdict = self._zdict(wk)
        need = dictionary_id(blob)
        if need is not None and (zdict is None or zlib.adler32(zdict) != need):
            self._zdict_cache.pop(wk, None)
            zdict = self._zdict(wk)
        return unpack_text(blob, zdict)

    def _whole(self, wk: str, cand: str, blob: bytes) -> StoredRecord | None:
        try:
            return StoredRecord.loads(self.record_text(wk, blob))
        except Exception as e:  # noqa: BLE001 - bad data must never crash a worker
            log.warning("store: corrupt record at %s[%s] skipped: %s", keys.hot(wk), cand, e)
            return None

    def has_candidate(self, wk: str, candidate: str) -> bool:
        return bool(self.conn.r.hexists(keys.records(wk), candidate))

    def records(self, wk: str) -> list[StoredRecord]:
        out: dict[str, StoredRecord] = {}
        pipe = self.conn.rb.pipeline(transaction=False)
        pipe.hgetall(keys.hot(wk))
        pipe.hgetall(keys.records(wk))
        pipe.hgetall(keys.best(wk))
        hot, entries, best = pipe.execute()
        blobs = [(c, b) for c, b in entries.items() if b[:1] == b"{"]  # the layout before
        blobs += list(hot.items())
        if best.get(b"record") and best.get(b"cand"):
            blobs.append((best[b"cand"], best[b"record"]))
        for cand, blob in blobs:
            if cand.decode() not in out:
                rec = self._whole(wk, cand.decode(), blob)
                if rec is not None:
                    out[rec.candidate] = rec
        return list(out.values())

    def whole(self, wk: str, candidates: Collection[str]) -> dict[str, StoredRecord]:
        cands = list(dict.fromkeys(candidates))
        if not cands:
            return {}
        pipe = self.conn.rb.pipeline(transaction=False)
        pipe.hmget(keys.hot(wk), cands)
        pipe.hmget(keys.records(wk), cands)
        pipe.hmget(keys.best(wk), "cand", "record")
        hot, entries, (best_cand, best_rec) = pipe.execute()
        out: dict[str, StoredRecord] = {}
        for cand, blob, entry in zip(cands, hot, entries, strict=True):
            if blob is None and entry is not None and entry[:1] == b"{":
                blob = entry  # the layout before
            if blob is None and best_cand == cand.encode():
                blob = best_rec
            rec = None if blob is None else self._whole(wk, cand, blob)
            if rec is not None:
                out[cand] = rec
        return out

    def entries(self, wk: str) -> list[Entry]:
        out = []
        for cand, text in self.conn.r.hgetall(keys.records(wk)).items():
            try:
                out.append(parse_entry(cand, text))
            except Exception as e:  # noqa: BLE001 - reported, never fatal
                log.warning("store: corrupt entry at %s[%s] skipped: %s", keys.records(wk),
                            cand, e)
        return out

    def entry(self, wk: str, candidate: str) -> Entry | None:
        text = self.conn.r.hget(keys.records(wk), candidate)
        try:
            return None if text is None else parse_entry(candidate, text)
        except Exception as e:  # noqa: BLE001
            log.warning("store: corrupt entry at %s[%s]: %s", keys.records(wk), candidate, e)
            return None

    def get_record(self, wk: str, candidate: str) -> StoredRecord | None:
        pipe = self.conn.rb.pipeline(transaction=False)
        pipe.hget(keys.hot(wk), candidate)
        pipe.hget(keys.records(wk), candidate)
        pipe.hmget(keys.best(wk), "cand", "record")
        hot, entry, (best_cand, best_rec) = pipe.execute()
        blob = hot or (entry if entry and entry[:1] == b"{" else None)
        if blob is None and best_cand == candidate.encode():
            blob = best_rec
        if blob is not None:
            return self._whole(wk, candidate, blob)
        return None if entry is None else self.from_archive(wk, candidate)

    def record_count(self, wk: str) -> int:
        # no MULTI: a full Redis (noeviction) refuses a transaction, even of reads
        pipe = self.conn.r.pipeline(transaction=False)
        pipe.hlen(keys.records(wk))
        pipe.scard(keys.unverified(wk))
        total, unverified = pipe.execute()
        return int(total) - int(unverified)

    def unverified_count(self, wk: str) -> int:
        return int(self.conn.r.scard(keys.unverified(wk)))

    def remove_records(self, wk: str, candidates: list[str]) -> int:
        if not candidates:
            return 0
        return int(self.conn.scripts.remove(
            keys=[keys.records(wk), keys.best(wk), keys.unverified(wk), keys.device_lost(wk),
                  keys.hot(wk)],
            args=list(candidates)))

    def remove_workload(self, wk: str) -> bool:
        """Its compression dictionary stays: a workload key's dictionary never changes, so a
        process that read it before (a drainer, a worker) packs and reads right when the
        workload is tuned again."""
        task = self.get_workload(wk)
        fields = [f for f in self.conn.r.hkeys(keys.workload(wk)) if f != "zdict"]
        pipe = self.conn.r.pipeline(transaction=True)
        pipe.delete(keys.records(wk), keys.best(wk), keys.unverified(wk),
                    keys.device_lost(wk), keys.features(wk), keys.hot(wk))
        if fields:
            pipe.hdel(keys.workload(wk), *fields)
        pipe.zrem(keys.workload_index(), wk)
        if task is not None:
            mkey = model_key(task.device_key, task.target)
            pipe.srem(keys.model_workloads(mkey), wk)
            pipe.hdel(keys.model_families(mkey), wk)
        done = pipe.execute()
        if self.local_features is not None:
            self.local_features.forget(wk)
        return int(done[0]) + (int(done[1]) if fields else 0) > 0

    def best(self, wk: str) -> StoredRecord | None:
        cand, blob = self.conn.rb.hmget(keys.best(wk), "cand", "record")
        if cand is None:
            return None
        if blob is None:  # its whole record is in the archive only
            return self.get_record(wk, cand.decode())
        return self._whole(wk, cand.decode(), blob)

    def best_candidates(self, workloads: list[str]) -> dict[str, str]:
        pipe = self.conn.r.pipeline(transaction=False)
        for wk in workloads:
            pipe.hget(keys.best(wk), "cand")
        return {wk: cand for wk, cand in zip(workloads, pipe.execute(), strict=True) if cand}

    def note_device_lost(self, wk: str, candidate: str) -> int:
        return int(self.conn.r.hincrby(keys.device_lost(wk), candidate, 1))

    def mark_exhausted(self, wk: str, count: int) -> None:
        self.conn.r.hset(keys.workload(wk), "exhausted_at", str(count))

    def exhausted(self, wk: str) -> bool:
        return self.conn.r.hget(keys.workload(wk), "exhausted_at") is not None

