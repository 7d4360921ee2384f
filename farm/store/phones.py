"""What each phone did: its measurements as spans, and its totals (a phone's day).

A phone is its device key and the address it registered at its tracker ("host:port"): the
address a worker's session connected to (workers/metaschedule/runner.py learns it from the tracker).

- A *span* is one measurement in flight on one phone: from the session the tracker granted
  to the session's end (upload, run, clean-up). Its outcome is "ok", a failure class, or
  "device_lost" (the phone froze or vanished: the span ends at the runner's deadline).
- *busy_s* sums a phone's spans; *work_s* is the time its key had work (a job of the key
  tuning), counted by the worker host's heartbeat for every phone on its tracker, so a phone
  that measured nothing while its key had work shows idle time and 0 busy seconds;
  idle_s = work_s - busy_s.
- *Heat*: its thermometer's readings (farm/devices/thermometer.py): the fastest reading is
  its baseline; two readings in a row more than a share slower make it hot, set it aside
  for a rest and are counted (`hot`); the time of its last cool reading bounds which
  measurements a hot one puts in doubt.

Contract of every `PhoneLedger` (tests/unit/test_store_*.py): spans add to their
phone's totals (busy, measurements, device lost) and to their job's list, in order;
`add_phone_work` adds to work_s and makes a phone known even before it measured;
`phone_heat` keeps the fastest reading as the baseline, sets a phone aside on its second
reading in a row over the share and answers the last cool reading's time.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from dataclasses import dataclass
from typing import Protocol

from farm.core.aliases import JsonDict
from farm.core.messages import _Message

SPANS_KEPT = 100_000  # spans kept per job, about (batches of them: the oldest dropped beyond)


@dataclass(frozen=True)
class PhoneSpan(_Message):
    """One measurement in flight on one phone."""

    kind = "phone span"
    phone: str  # the address it registered at its tracker
    key: str  # its device key
    worker: str  # the worker host whose round sent it
    job_id: str
    workload_key: str
    task: str
    batch: str  # round id and batch index: a bar of the report's timeline
    start: float  # epoch seconds
    end: float
    outcome: str  # "ok", a failure class, or "device_lost"

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


@dataclass(frozen=True)
class PhoneStat(_Message):
    """A phone's totals since the farm first saw it."""

    kind = "phone totals"
    phone: str
    key: str
    worker: str = ""
    busy_s: float = 0.0
    work_s: float = 0.0  # its key had work queued or running
    measurements: int = 0
    device_lost: int = 0
    last_at: float = 0.0  # the end of its last measurement (0: never measured)
    aside_until: float = 0.0  # set aside (lost too often, or hot) until then; 0: never was
    aside_why: str = ""  # "lost" or "hot"
    heat_base_us: float = 0.0  # its thermometer's fastest reading (0: never read)
    heat_us: float = 0.0  # its last reading
    heat_at: float = 0.0  # ... when
    hot: int = 0  # hot readings

    @property
    def heat(self) -> float | None:
        """How much slower its last reading was than its fastest (0.1: 10 %); None: unread."""
        return self.heat_us / self.heat_base_us - 1 if self.heat_base_us > 0 else None

    @property
    def idle_s(self) -> float:
        return max(0.0, self.work_s - self.busy_s)

    @property
    def mean_ms(self) -> float | None:
        return 1000 * self.busy_s / self.measurements if self.measurements else None


def job_phones(spans: list[PhoneSpan], registered: dict[str, str],
               wall_s: float) -> list[JsonDict]:
    """Per phone of a job (those that measured for it, and `registered`: the phones of its key
    on the trackers now, phone -> worker host, with 0 busy seconds when they measured nothing):
    busy and idle seconds, utilization = busy / the job's tuning wall, measurements, device
    lost, mean measurement time."""
    rows: dict[str, JsonDict] = {
        phone: {"phone": phone, "worker": worker, "busy_s": 0.0, "measurements": 0,
                "device_lost": 0}
        for phone, worker in registered.items()}
    for sp in spans:
        row = rows.setdefault(sp.phone, {"phone": sp.phone, "worker": sp.worker, "busy_s": 0.0,
                                         "measurements": 0, "device_lost": 0})
        row["worker"] = sp.worker
        row["busy_s"] += sp.seconds
        row["measurements"] += 1
        row["device_lost"] += sp.outcome == "device_lost"
    for row in rows.values():
        busy = row["busy_s"]
        row["busy_s"] = round(busy, 2)
        row["idle_s"] = round(max(0.0, wall_s - busy), 2)
        row["utilization"] = round(busy / wall_s, 3) if wall_s > 0 else 0.0
        row["mean_ms"] = round(1000 * busy / row["measurements"], 1) if row["measurements"] \
            else None
    return sorted(rows.values(), key=lambda r: (r["worker"], r["phone"]))


def tuning_wall(spans: list[PhoneSpan], started_at: float | None = None,
                until: float | None = None) -> float:
    """The job's tuning wall: from its start (or its first measurement) to its last
    measurement, or to `until` (a job still running: now)."""
    starts = [s.start for s in spans] + ([started_at] if started_at else [])
    ends = [s.end for s in spans] + ([until] if until else [])
    return max(0.0, max(ends) - min(starts)) if starts and ends else 0.0


def phone_rows(stats: list[PhoneStat], registered: set[str]) -> list[JsonDict]:
    """`farm devices`' phones: totals, and whether the phone is on a live host's tracker now."""
    return [{"phone": s.phone, "key": s.key, "worker": s.worker,
             "registered": s.phone in registered, "measurements": s.measurements,
             "busy_s": round(s.busy_s, 2), "idle_s": round(s.idle_s, 2),
             "work_s": round(s.work_s, 2), "device_lost": s.device_lost,
             "mean_ms": None if s.mean_ms is None else round(s.mean_ms, 1),
             "last_at": s.last_at or None,
             "aside_until": s.aside_until if s.aside_until > time.time() else None,
             "aside_why": s.aside_why if s.aside_until > time.time() else None,
             "heat": None if s.heat is None else round(s.heat, 3),
             "heat_us": round(s.heat_us, 2) if s.heat_us else None,
             "heat_base_us": round(s.heat_base_us, 2) if s.heat_base_us else None,
             "hot": s.hot}
            for s in stats]


def format_phones(rows: list[JsonDict]) -> str:
    if not rows:
        return "no phone has measured or had work yet"
    lines = [f"{'phone':24} {'device key':16} {'worker host':22} {'state':10} {'meas.':>6} "
             f"{'busy':>8} {'idle':>8} {'mean':>9} {'lost':>5} {'heat':>6} {'hot':>4}"]
    for r in rows:
        mean = f"{r['mean_ms']:.0f} ms" if r["mean_ms"] is not None else "-"
        state = "registered" if r["registered"] else "gone"
        if r["aside_until"]:
            until = time.strftime("%H:%M:%S", time.localtime(r["aside_until"]))
            state = f"{'hot: resting' if r['aside_why'] == 'hot' else 'set aside'} until {until}"
        heat = f"{r['heat']:+.0%}" if r["heat"] is not None else "-"
        lines.append(f"{r['phone']:24} {r['key']:16} {r['worker']:22} {state:10} "
                     f"{r['measurements']:6} "
                     f"{r['busy_s']:7.0f}s {r['idle_s']:7.0f}s {mean:>9} {r['device_lost']:5} "
                     f"{heat:>6} {r['hot']:4}")
    lines.append("(busy: a measurement in flight; idle: its key had work and it measured nothing; "
                 "set aside: lost too often, not measured on until then; heat: its thermometer's "
                 "last reading against its fastest; hot: readings over the profile's "
                 "heat_share, each followed by a rest)")
    return "\n".join(lines)


class PhoneLedger(Protocol):
    @abstractmethod
    def note_phone_spans(self, spans: list[PhoneSpan]) -> None:
        """Add measurements: to each phone's totals and to its job's list of spans."""

    @abstractmethod
    def add_phone_work(self, key: str, phone: str, worker: str, seconds: float) -> None:
        """`seconds` more during which the phone's key had work (the heartbeat's count)."""

    @abstractmethod
    def phone_lost(self, key: str, phone: str, at: float, window_s: float, limit: int,
                   aside_s: float) -> float:
        """Note that the phone was lost at `at`; when that makes `limit` losses within
        `window_s`, set it aside until `at + aside_s` (and forget those losses). Returns the
        time it is set aside until (0: it is not)."""

    @abstractmethod
    def phone_heat(self, key: str, phone: str, us: float, at: float, share: float,
                   rest_s: float) -> tuple[bool, float, float]:
        """Note a thermometer reading of `us` at `at`: hot when it is more than `share`
        slower than the phone's baseline (its fastest reading; the first reading makes it);
        a hot phone is set aside until `at + rest_s` (why: "hot"), a cool reading lowers the
        baseline where it is faster. Returns (hot, the baseline, the time of the phone's last
        cool reading before this one: 0 for none)."""

    @abstractmethod
    def phone_stats(self) -> list[PhoneStat]:
        """Every phone the farm has seen, sorted by key and address."""

    @abstractmethod
    def job_phone_spans(self, job_id: str) -> list[PhoneSpan]:
        """The job's spans, in the order they were noted."""


def phone_stat(member: str, raw: dict[str, str]) -> PhoneStat:
    key, phone = member.split("|", 1)
    return PhoneStat(phone=phone, key=key, worker=raw.get("worker", ""),
                     busy_s=float(raw.get("busy_s", 0)), work_s=float(raw.get("work_s", 0)),
                     measurements=int(raw.get("measurements", 0)),
                     device_lost=int(raw.get("device_lost", 0)),
                     last_at=float(raw.get("last_at", 0)),
                     aside_until=float(raw.get("aside_until", 0)),
                     aside_why=raw.get("aside_why", "lost" if raw.get("aside_until") else ""),
                     heat_base_us=float(raw.get("heat_base_us", 0)),
                     heat_us=float(raw.get("heat_us", 0)), heat_at=float(raw.get("heat_at", 0)),
                     hot=int(float(raw.get("hot", 0))))


# readings in a row over the share that make a phone hot: heat lasts, a moment's load on the
# phone (another app, a burst of the OS) does not; one slow reading alone rested a cool phone
# for minutes. The readings between stay in doubt all the same: the last cool one bounds them.
HEAT_CONFIRM = 2


def heat_verdict(raw: dict[str, str], us: float, at: float, share: float,
                 rest_s: float) -> tuple[bool, float, float, dict[str, str]]:
    """`phone_heat`'s rule on a phone's ledger fields (both backends): (hot, baseline, last
    cool reading before, the fields to write). Hot: HEAT_CONFIRM readings in a row more than
    `share` slower than the baseline (the first of them is neither hot nor cool)."""
    base = float(raw.get("heat_base_us") or 0)
    cool_at = float(raw.get("heat_cool_at") or 0)
    over = base > 0 and us > base * (1 + share)
    in_a_row = int(float(raw.get("heat_over") or 0)) + 1 if over else 0
    hot = in_a_row >= HEAT_CONFIRM
    out = {"heat_us": repr(us), "heat_at": repr(at), "heat_over": str(in_a_row)}
    if over and not hot:
        return False, base, cool_at, out
    if hot:
        out |= {"hot": str(int(float(raw.get("hot") or 0)) + 1), "aside_why": "hot",
                "aside_until": repr(max(float(raw.get("aside_until") or 0), at + rest_s))}
    else:
        base = us if base <= 0 else min(base, us)
        out |= {"heat_base_us": repr(base), "heat_cool_at": repr(at)}
    return hot, base, cool_at, out
