"""Which phone measured which candidate, and for how long: the runner's session hooks.

MetaSchedule's RPCRunner asks the tracker for "a phone of key K" and never says which one
it got. The runner's pool processes use these hooks instead (RPCRunner's f_create_session,
f_upload_module and f_cleanup): the session comes from `tracker.request_session`, which
names the phone, and each measurement writes one JSON line when it starts (its artifact,
phone and start time) and one when its session ends. A pool process killed at the runner's
deadline (a frozen phone) writes no end: that phone's span ends at the deadline, device lost.

The round's StoreCallback turns the lines of a batch into `PhoneSpan`s (`PhoneLog.spans`).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from farm.devices.tracker import request_session
from farm.store.phones import PhoneSpan

_SESSION: dict[str, Any] = {}  # in a pool process: the measurement in flight


def _write(path: str, entry: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:  # one short append: atomic between processes
        f.write(json.dumps(entry) + "\n")


def create_session(log_path: str, tracker: str, rpc_config: Any) -> Any:
    """f_create_session: a session on a phone of the key, remembering which phone it is."""
    _SESSION.clear()
    session, phone = request_session(tracker, rpc_config.tracker_key,
                                     rpc_config.session_timeout_sec, rpc_config.session_priority)
    _SESSION.update(phone=phone, start=time.time())
    return session


def upload_module(log_path: str, session: Any, local_path: str, remote_path: str) -> Any:
    """f_upload_module: note the measurement's start (the artifact names the candidate)."""
    from tvm.s_tir.meta_schedule.runner.rpc_runner import default_upload_module

    _SESSION["artifact"] = local_path
    _write(log_path, {"artifact": local_path, "phone": _SESSION["phone"],
                      "start": _SESSION["start"]})
    return default_upload_module(session, local_path, remote_path)


def cleanup(log_path: str, session: Any, remote_path: str | None) -> None:
    """f_cleanup: TVM's clean-up, then note the measurement's end."""
    from tvm.s_tir.meta_schedule.runner.rpc_runner import default_cleanup

    try:
        default_cleanup(session, remote_path)
    finally:
        if "artifact" in _SESSION:
            _write(log_path, {"artifact": _SESSION["artifact"], "end": time.time()})
        _SESSION.clear()


class PhoneLog:
    """The round side of the hooks: reads what the pool processes wrote, batch by batch."""

    def __init__(self, path: str, deadline_s: float) -> None:
        self.path = path
        self.deadline_s = deadline_s  # the runner's pool timeout: a span never lasts longer
        self._offset = 0
        self._open: dict[str, dict[str, Any]] = {}  # artifact -> its lines so far

    def _read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        complete = data[:data.rfind(b"\n") + 1]  # a line being written is read next time
        self._offset += len(complete)
        for line in complete.decode("utf-8", "replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            self._open.setdefault(str(entry.get("artifact")), {}).update(entry)

    def spans(self, artifacts: list[str | None], outcomes: list[str], **common: str) -> list[
            PhoneSpan]:
        """The spans of one batch's candidates (by artifact path; a candidate that never reached
        a phone has none), with their outcomes and the fields `common` to them all."""
        self._read()
        out = []
        for artifact, what in zip(artifacts, outcomes, strict=True):
            seen = self._open.pop(str(artifact), None) if artifact else None
            if not seen or "phone" not in seen:
                continue
            start = float(seen["start"])
            end = float(seen["end"]) if "end" in seen else min(time.time(),
                                                               start + self.deadline_s)
            out.append(PhoneSpan(phone=seen["phone"], start=start, end=end,
                                 outcome=what if "end" in seen else "device_lost", **common))
        self._open.clear()  # between batches nothing writes: start the file again
        try:
            os.truncate(self.path, 0)
        except FileNotFoundError:
            pass
        self._offset = 0
        return out
