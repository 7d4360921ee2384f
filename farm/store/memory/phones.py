"""The phones' ledger in memory (farm/store/phones.py says what it keeps): `MemoryPhoneLedger`,
a part of MemoryStore (store.py), with a lock of its own."""

from __future__ import annotations

import json
import threading

from farm.store.phones import (
    SPANS_KEPT,
    PhoneLedger,
    PhoneSpan,
    PhoneStat,
    heat_verdict,
    phone_stat,
)


class MemoryPhoneLedger(PhoneLedger):
    """The phones' ledger of MemoryStore, with the Redis one's semantics."""

    def __init__(self) -> None:
        self._phone_lock = threading.Lock()
        self._phones: dict[str, dict[str, str]] = {}
        self._spans: dict[str, list[str]] = {}
        self._losses: dict[str, list[float]] = {}

    def _add(self, key: str, phone: str, **fields: float | str) -> None:
        row = self._phones.setdefault(f"{key}|{phone}", {})
        for name, value in fields.items():
            if isinstance(value, str):
                row[name] = value
            else:
                row[name] = json.dumps(float(row.get(name, 0)) + value)

    def note_phone_spans(self, spans: list[PhoneSpan]) -> None:
        with self._phone_lock:
            for sp in spans:
                self._add(sp.key, sp.phone, busy_s=sp.seconds, measurements=1,
                          device_lost=1 if sp.outcome == "device_lost" else 0,
                          worker=sp.worker, last_at=repr(sp.end))
                spans_of = self._spans.setdefault(sp.job_id, [])
                spans_of.append(sp.dumps())
                del spans_of[:-SPANS_KEPT]

    def add_phone_work(self, key: str, phone: str, worker: str, seconds: float) -> None:
        with self._phone_lock:
            self._add(key, phone, work_s=seconds, worker=worker)

    def phone_lost(self, key: str, phone: str, at: float, window_s: float, limit: int,
                   aside_s: float) -> float:
        with self._phone_lock:
            losses = [t for t in self._losses.get(f"{key}|{phone}", []) if t > at - window_s]
            losses.append(at)
            self._losses[f"{key}|{phone}"] = losses
            if len(losses) < limit:
                return 0.0
            self._losses.pop(f"{key}|{phone}")
            self._add(key, phone, aside_until=repr(at + aside_s), aside_why="lost")
            return at + aside_s

    def phone_heat(self, key: str, phone: str, us: float, at: float, share: float,
                   rest_s: float) -> tuple[bool, float, float]:
        with self._phone_lock:
            row = self._phones.setdefault(f"{key}|{phone}", {})
            hot, base, cool_at, fields = heat_verdict(row, us, at, share, rest_s)
            row.update(fields)
            return hot, base, cool_at

    def phone_stats(self) -> list[PhoneStat]:
        with self._phone_lock:
            rows = {m: dict(raw) for m, raw in self._phones.items()}
        out = []
        for m, raw in sorted(rows.items()):
            for name in ("measurements", "device_lost", "hot"):
                raw[name] = str(int(float(raw.get(name, 0))))
            out.append(phone_stat(m, raw))
        return out

    def job_phone_spans(self, job_id: str) -> list[PhoneSpan]:
        with self._phone_lock:
            return [PhoneSpan.loads(raw) for raw in self._spans.get(job_id, [])]
