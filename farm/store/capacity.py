"""How full the store is and how soon it will be: bytes per measurement, measurements per
day, days until Redis reaches its maxmemory (with noeviction it then refuses every write).

Every measurement is one stored record (valid or failed), so the records are the count.
`farm cache stats` prints it, `farm doctor` warns when fewer than WARN_DAYS are left, and
a worker's /metrics exports the memory it is computed from.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from farm.store.store import FarmView

DAY_S = 86400.0
WARN_DAYS = 7.0


@dataclass(frozen=True)
class Capacity:
    used_bytes: int  # Redis's used_memory (every key: records, jobs, the broker)
    max_bytes: int  # its maxmemory; 0: no limit (or not Redis)
    measurements: int  # records in the store
    per_day: float  # measurements a day: over the last day, or the store's life if younger
    base_bytes: int = 0  # what Redis uses holding nothing (not the measurements')

    @property
    def bytes_per_measurement(self) -> float | None:
        """What the store holds per measurement (every key, Redis's own memory not)."""
        held = max(0, self.used_bytes - self.base_bytes)
        return held / self.measurements if self.measurements else None

    @property
    def days_until_full(self) -> float | None:
        """At the current rate; None without a limit or without measurements lately."""
        per = self.bytes_per_measurement
        if not self.max_bytes or not per or self.per_day <= 0:
            return None
        return max(0.0, self.max_bytes - self.used_bytes) / (per * self.per_day)

    def to_json(self) -> dict[str, float | None]:
        per, days = self.bytes_per_measurement, self.days_until_full
        return {"used_bytes": self.used_bytes, "maxmemory_bytes": self.max_bytes,
                "measurements": self.measurements,
                "bytes_per_measurement": None if per is None else round(per, 1),
                "measurements_per_day": round(self.per_day, 1),
                "days_until_full": None if days is None else round(days, 2)}


def capacity(store: FarmView, now: float | None = None,
             times: list[float] | None = None) -> Capacity:
    """The store's capacity now, from every record's time (`times`, when the caller read the
    records already; else a scan of the store)."""
    now = time.time() if now is None else now
    if times is None:
        times = [e.measured_at for wk in store.workload_keys() for e in store.entries(wk)]
    used, limit = store.memory() or (0, 0)
    recent = sum(1 for t in times if t >= now - DAY_S)
    oldest = min((t for t in times if t > 0), default=now)
    span_days = min(1.0, max((now - oldest) / DAY_S, 1.0 / 24))  # at least an hour's worth
    return Capacity(used_bytes=used, max_bytes=limit, measurements=len(times),
                    per_day=recent / span_days, base_bytes=store.memory_at_start())
