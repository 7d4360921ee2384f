"""Which phone measured which candidate, and for how long: the runner's session hooks.

MetaSchedule's RPCRunner asks the tracker for "a phone of key K" and never says which one
it got. The runner's pool processes use these hooks instead (RPCRunner's f_create_session,
f_upload_module and f_cleanup): the session comes from `tracker.request_session`, which
names the phone, and each measurement writes one JSON line when it starts (its artifact,
phone and start time) and one when its session ends. A pool process killed at the runner's
deadline (a frozen phone) writes no end: that phone's span ends at the deadline, device lost.

The round's StoreCallback turns the lines of a batch into `PhoneSpan`s (`PhoneLog.spans`);
lines are keyed by session (pool process id and its session count).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

from farm.devices.tracker import grant, phone_address
from farm.store.phones import PhoneSpan

_SESSION: dict[str, Any] = {"n": 0}  # in a pool process: the measurement in flight


def _write(path: str, entry: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:  # one short append: atomic between processes
        f.write(json.dumps(entry) + "\n")


def create_session(log_path: str, tracker: str, rpc_config: Any) -> Any:
    """f_create_session: a session on a phone of the key. The phone is noted as soon as the
    tracker grants it, before connecting: a frozen phone hangs the connection, and the pool
    kills this process at its deadline."""
    from tvm.rpc import client

    url, port, matchkey = grant(tracker, rpc_config.tracker_key, rpc_config.session_priority)
    _SESSION["n"] += 1
    _SESSION["sid"] = f"{os.getpid()}-{_SESSION['n']}"
    _write(log_path, {"sid": _SESSION["sid"], "phone": phone_address(url, port),
                      "start": time.time()})
    return client.connect(url, port, matchkey, int(rpc_config.session_timeout_sec))


def upload_module(log_path: str, session: Any, local_path: str, remote_path: str) -> Any:
    """f_upload_module: note which candidate the session measures (its artifact)."""
    from tvm.s_tir.meta_schedule.runner.rpc_runner import default_upload_module

    _write(log_path, {"sid": _SESSION.get("sid"), "artifact": local_path})
    return default_upload_module(session, local_path, remote_path)


def cleanup(log_path: str, session: Any, remote_path: str | None) -> None:
    """f_cleanup: TVM's clean-up, then note the session's end."""
    from tvm.s_tir.meta_schedule.runner.rpc_runner import default_cleanup

    try:
        default_cleanup(session, remote_path)
    finally:
        sid = _SESSION.pop("sid", None)
        if sid is not None:
            _write(log_path, {"sid": sid, "end": time.time()})


class PhoneLog:
    """The round side of the hooks: reads what the pool processes wrote, batch by batch."""

    def __init__(self, path: str, deadline_s: float) -> None:
        self.path = path
        self.deadline_s = deadline_s  # the runner's pool timeout: a span never lasts longer

    def _read(self) -> dict[str, dict[str, Any]]:
        """Session id -> what its lines say (phone, start, artifact, end)."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return {}
        complete = data[:data.rfind(b"\n") + 1]  # a line being written is not whole yet
        sessions: dict[str, dict[str, Any]] = {}
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
        for seen in self._read().values():
            if "phone" not in seen:
                continue
            start = float(seen["start"])
            ended = "end" in seen
            end = float(seen["end"]) if ended else min(time.time(), start + self.deadline_s)
            what = outcome_of.get(seen.get("artifact", ""), "device_lost")
            out.append(PhoneSpan(phone=seen["phone"], start=start, end=end,
                                 outcome=what if ended else "device_lost", **common))
        with contextlib.suppress(FileNotFoundError):  # between batches nothing writes
            os.truncate(self.path, 0)
        return sorted(out, key=lambda sp: sp.start)
