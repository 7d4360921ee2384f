"""Which phone measured which candidate, and for how long: the runner's session hooks.

MetaSchedule's RPCRunner asks the tracker for "a phone of key K" and never says which one
it got. The runner's pool processes use these hooks instead (RPCRunner's f_create_session,
f_upload_module and f_cleanup): the session comes from `tracker.request_session`, which
names the phone, and each measurement writes one JSON line when it starts (its artifact,
phone and start time) and one when its session ends. A pool process killed at the runner's
deadline (a frozen phone) writes no end: that phone's span ends at the deadline, device lost.

The round's StoreCallback turns the lines of a batch into `PhoneSpan`s (`PhoneLog.spans`);
lines are keyed by session (pool process id and its session count).

Heat: a session whose phone was last read more than the profile's `heat_check_s` ago (by
any process of this host) reads its thermometer first (farm/devices/thermometer.py) and
writes the reading; the round compares it with the phone's baseline in the store
(`PhoneLog.commit`) and a hot phone rests (set aside, as a phone lost too often is).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from farm.core.aliases import JsonDict, RPCSession, RuntimeModule
from farm.core.errors import ServiceError
from farm.core.secrets import runtime_dir
from farm.devices import thermometer as thermo_mod
from farm.devices import tracker as tracker_mod
from farm.devices.evaluate import configure_threads
from farm.devices.thermometer import Thermometer
from farm.devices.tracker import grant, phone_address
from farm.store.phones import PhoneLedger, PhoneSpan
from workers.metaschedule.turns import settle

if TYPE_CHECKING:
    from tvm.s_tir.meta_schedule.runner import RPCConfig

log = logging.getLogger(__name__)
# per phone, when something last happened to it on this host (any process), a file each:
# "phone-ends" its last session's end (cool-down), "phone-heat" its last thermometer reading
_STAMPS: dict[str, str] = {}  # kind -> its folder (this user's: runtime_dir)


@dataclass
class _Session:
    """The measurement in flight in this pool process. Process state, not an object passed
    along: TVM's runner calls the three hooks one after another with nothing of the farm's
    between them (each pool process measures one candidate at a time)."""

    n: int = 0  # sessions this process opened
    sid: str | None = None  # the session's id: pid-n
    phone: str = ""  # the phone's address, as the tracker granted it


_SESSION = _Session()


def _stamp_path(kind: str, phone: str) -> str:
    if kind not in _STAMPS:
        _STAMPS[kind] = runtime_dir(kind)
    return os.path.join(_STAMPS[kind], phone.replace("/", "_"))


def _stamped(kind: str, phone: str) -> float:
    """When `kind` last happened to the phone on this host (0: never known)."""
    try:
        with open(_stamp_path(kind, phone), encoding="utf-8") as f:
            return float(f.read() or 0)
    except (OSError, ValueError):
        return 0.0


def _stamp(kind: str, phone: str, at: float) -> None:
    """Note that `kind` happened to the phone at `at` (written whole: others read it)."""
    path = _stamp_path(kind, phone)
    with contextlib.suppress(OSError):
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(repr(at))
        os.replace(tmp, path)


def _write(path: str, entry: JsonDict) -> None:
    with open(path, "a", encoding="utf-8") as f:  # one short append: atomic between processes
        f.write(json.dumps(entry) + "\n")


def create_session(log_path: str, tracker: str, cooldown_s: float, rpc_config: RPCConfig,
                   ticket: str = "", threads: tuple[int, str] | None = None,
                   heat: Thermometer | None = None) -> RPCSession:
    """f_create_session: a session on a phone of the key that is not set aside. The phone is
    noted as soon as the tracker grants it, before connecting: a frozen phone hangs the
    connection, and the pool kills this process at its deadline. A phone set aside is not
    connected to (the tracker hands it out again once it re-registers, ~6 s later); a phone
    that measured less than `cooldown_s` ago cools down first, connected (so no one else uses
    it), and the wait does not count as busy. The grant (or the failure to get one) settles
    the measurement's turn in its batch (`ticket`: workers/metaschedule/turns.py). `threads`: the
    session's thread count and affinity on the phone (a CPU profile's; farm/devices/evaluate.py).
    `heat`: the profile's thermometer, read when the phone's last reading is old enough."""
    from tvm.rpc import client

    aside = _aside(log_path)
    give_up = time.monotonic() + rpc_config.session_timeout_sec / 2  # then take any phone
    try:
        while True:
            url, port, matchkey = grant(tracker, rpc_config.tracker_key,
                                        rpc_config.session_priority)
            phone = phone_address(url, port)
            if aside.get(phone, 0.0) <= time.time() or time.monotonic() > give_up:
                break
    finally:
        settle(ticket)
    _SESSION.n += 1
    _SESSION.sid = sid = f"{os.getpid()}-{_SESSION.n}"
    _SESSION.phone = phone
    _write(log_path, {"sid": sid, "phone": phone, "start": time.time()})
    session = client.connect(url, port, matchkey, int(rpc_config.session_timeout_sec))
    if threads is not None:
        configure_threads(session, *threads)
    if cooldown_s > 0:
        wait = cooldown_s - (time.time() - _stamped("phone-ends", phone))
        if wait > 0:
            time.sleep(wait)
            _write(log_path, {"sid": sid, "cooled": wait})
    if heat is not None and time.time() - _stamped("phone-heat", phone) >= heat.every_s:
        _read_heat(log_path, sid, phone, session, heat)
    return session


def _read_heat(log_path: str, sid: str, phone: str, session: RPCSession,
               heat: Thermometer) -> None:
    """Read the phone's thermometer and write the reading (and how long it took, which is
    not the measurement's time). A thermometer that fails is logged: the measurement goes on
    (a phone that broke shows in the candidate's own run)."""
    t0 = time.time()
    try:
        us = thermo_mod.read(session, heat)
    except Exception as e:  # noqa: BLE001 - a reading is an extra, never the measurement
        log.warning("phone %s: its thermometer could not be read: %s", phone, e)
        return
    took = time.time() - t0
    _write(log_path, {"sid": sid, "heat_us": us, "heat_at": t0, "heat_s": took})
    _stamp("phone-heat", phone, t0)


def _aside(log_path: str) -> dict[str, float]:
    """The phones set aside now (written by the round: `PhoneLog.refresh`), -> until when."""
    try:
        with open(log_path + ".aside", encoding="utf-8") as f:
            return {str(k): float(v) for k, v in json.load(f).items()}
    except (OSError, ValueError, AttributeError):
        return {}



def upload_module(log_path: str, session: RPCSession, local_path: str,
                  remote_path: str) -> RuntimeModule:
    """f_upload_module: note which candidate the session measures (its artifact)."""
    from tvm.s_tir.meta_schedule.runner.rpc_runner import default_upload_module

    _write(log_path, {"sid": _SESSION.sid, "artifact": local_path})
    return default_upload_module(session, local_path, remote_path)


def cleanup(log_path: str, session: RPCSession, remote_path: str | None) -> None:
    """f_cleanup: TVM's clean-up, then note the session's end."""
    from tvm.s_tir.meta_schedule.runner.rpc_runner import default_cleanup

    try:
        default_cleanup(session, remote_path)
    finally:
        sid, phone = _SESSION.sid, _SESSION.phone
        _SESSION.sid, _SESSION.phone = None, ""
        if sid is not None:
            now = time.time()
            _write(log_path, {"sid": sid, "end": now})
            _stamp("phone-ends", phone, now)  # for the phone's cool-down, any process here


@dataclass(frozen=True)
class LostPolicy:
    """A phone lost `limit` times within `window_s` is set aside for `aside_s`; one whose
    thermometer reads more than `heat_share` slower than its fastest rests `heat_rest_s`."""

    limit: int = 3
    window_s: float = 600.0
    aside_s: float = 300.0
    heat_share: float = 0.25
    heat_rest_s: float = 120.0


@dataclass(frozen=True)
class Reading:
    """A phone's thermometer read in a session of the batch: `us` at `at`."""

    phone: str
    us: float
    at: float


class PhoneLog:
    """The round side of the hooks: reads what the pool processes wrote, batch by batch, and
    tells them which phones are set aside."""

    def __init__(self, path: str, deadline_s: float, tracker: str = "", key: str = "",
                 policy: LostPolicy | None = None) -> None:
        self.path = path
        self.deadline_s = deadline_s  # the runner's pool timeout: a span never lasts longer
        self.tracker = tracker
        self.key = key
        self.policy = policy or LostPolicy()
        self.readings: list[Reading] = []  # the last batch's thermometer readings (`spans`)
        self.phone_of: dict[str, str] = {}  # the last batch's artifacts -> their phone

    def commit(self, store: PhoneLedger, spans: list[PhoneSpan]) -> dict[str, float]:
        """Store a batch's spans and thermometer readings; a phone lost too often, or hot, is
        set aside (and said so). Returns the phones found hot, each with the time of its last
        cool reading before (its measurements since are in doubt; 0: it has none)."""
        store.note_phone_spans(spans)
        hot = self._heat(store)
        for sp in spans:
            if sp.outcome != "device_lost":
                continue
            p = self.policy
            until = store.phone_lost(sp.key, sp.phone, sp.end, p.window_s, p.limit, p.aside_s)
            if until:
                log.warning("phone %s (key %s) was lost %d times within %.0f s: set aside for "
                            "%.0f s", sp.phone, sp.key, p.limit, p.window_s, p.aside_s)
        self.refresh(store)
        return hot

    def _heat(self, store: PhoneLedger) -> dict[str, float]:
        """The batch's readings against each phone's baseline: the hot phones (-> their last
        cool reading's time), rested by the store."""
        p, hot = self.policy, {}
        for r in sorted(self.readings, key=lambda r: r.at):
            is_hot, base, cool_at = store.phone_heat(self.key, r.phone, r.us, r.at,
                                                     p.heat_share, p.heat_rest_s)
            if is_hot and r.phone not in hot:
                hot[r.phone] = cool_at
                log.warning("phone %s (key %s) is hot: its thermometer read %.1f us, %.0f %% "
                            "slower than its fastest %.1f us (the profile's heat_share: %.0f %%): "
                            "resting %.0f s; its measurements since %s are stored unverified "
                            "(measured again before one can be a best)", r.phone, self.key,
                            r.us, 100 * (r.us / base - 1), base, 100 * p.heat_share,
                            p.heat_rest_s, time.strftime("%H:%M:%S", time.localtime(cool_at))
                            if cool_at else "it was first read")
        return hot

    def refresh(self, store: PhoneLedger) -> dict[str, float]:
        """Write the phones of the key set aside now, for the next sessions. When every phone
        of the key on the tracker is set aside, none is: measuring on a flaky phone beats
        measuring on none."""
        now = time.time()
        aside = {s.phone: s.aside_until for s in store.phone_stats()
                 if s.key == self.key and s.aside_until > now}
        if aside and self.tracker:
            try:
                info = tracker_mod.phones(self.tracker).get(self.key)
            except ServiceError:  # the tracker is away a moment: the sessions will say so
                info = None
            if info is not None and set(info.phones) <= set(aside):
                log.warning("every phone of key %s is set aside: measuring on them anyway",
                            self.key)
                aside = {}
        tmp = f"{self.path}.aside.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(aside, f)
        os.replace(tmp, self.path + ".aside")
        return aside

    def _read(self) -> dict[str, JsonDict]:
        """Session id -> what its lines say (phone, start, artifact, end)."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return {}
        complete = data[:data.rfind(b"\n") + 1]  # a line being written is not whole yet
        sessions: dict[str, JsonDict] = {}
        for line in complete.decode("utf-8", "replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            sessions.setdefault(str(entry.get("sid")), {}).update(entry)
        return sessions

    def spans(self, artifacts: list[str | None], outcomes: list[str], **common: str) -> list[
            PhoneSpan]:
        """The spans of one batch: a span per session of the batch, with the outcome of the
        candidate it measured (by artifact path). A session with no end was killed at the
        runner's deadline, and one that never uploaded failed to connect: device lost."""
        outcome_of = {a: o for a, o in zip(artifacts, outcomes, strict=True) if a}
        out = []
        self.readings, self.phone_of = [], {}
        for seen in self._read().values():
            if "phone" not in seen:
                continue
            if "heat_us" in seen:
                self.readings.append(Reading(seen["phone"], float(seen["heat_us"]),
                                             float(seen["heat_at"])))
            if seen.get("artifact"):
                self.phone_of[seen["artifact"]] = seen["phone"]
            start = (float(seen["start"]) + float(seen.get("cooled", 0.0))
                     + float(seen.get("heat_s", 0.0)))
            ended = "end" in seen
            end = float(seen["end"]) if ended else min(time.time(), start + self.deadline_s)
            what = outcome_of.get(seen.get("artifact", ""), "device_lost")
            out.append(PhoneSpan(phone=seen["phone"], start=start, end=end,
                                 outcome=what if ended else "device_lost", **common))
        with contextlib.suppress(FileNotFoundError):  # between batches nothing writes
            os.truncate(self.path, 0)
        return sorted(out, key=lambda sp: sp.start)
