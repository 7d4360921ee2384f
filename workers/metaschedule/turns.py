"""A key's phones serve its batches in the order the batches came, host-wide.

Two rounds of a key run at once on a worker host so that one searches and builds while the
other's batch is on the phones (workers/round/gate.py). If both batches take phones as they free,
the phones serve them side by side: both end together, both rounds then search at the same
time and every phone waits for the host (bench/scaling.md, 2026-12-05: the rounds of a
4-phone run fell into step, utilization 0.72). Served one batch after the other, the
older batch ends a batch's time earlier, and its round searches its next one while the
phones serve the younger: the rounds stay out of step by themselves.

So before a measurement of a batch asks the tracker for a phone, it waits while an older
batch of the same tracker and key, in any process of this host, still has measurements
that the tracker has not given a phone: the older batch's requests are always the ones
waiting at the tracker when a phone frees. Counting a measurement when it *asks* was not
enough: the older batch's last request could reach the tracker a moment after a younger
one's, just as a phone freed, and the younger took it (a clean-clone run of 2026-12-05).
So a measurement counts once its phone is granted, or once asking failed (`settle`, in
the process that asks: phonelog.create_session), and a batch whose calls have all returned
holds no one, even where a call was killed before it could settle. Requests also carry a
priority (the older the batch, the higher). The wait is in the round process, before the
measurement's deadline starts (`run_timeout_s` counts from the request, not from the
queue), and the phones still go to whichever is free (a fast phone serves more).

Each batch is a file in a per-host directory, named by when the batch came (ns) and its
process, holding how many of its measurements have no phone yet (ten digits, rewritten in
place under a lock by the processes that ask). A batch whose process is gone, or that has
not moved for `stale_s` (a round that hangs), does not hold the others.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import threading
import time

from farm.core.secrets import runtime_dir

log = logging.getLogger(__name__)
QUEUE_DIR = ""  # the phones' queue of this machine: runtime_dir("phone-queue") when not given
POLL_S = 0.02


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


class Turns:
    """One round process's side of the queue of a tracker's key (its runner's batches)."""

    def __init__(self, tracker: str, key: str, stale_s: float, root: str = QUEUE_DIR) -> None:
        root = root or runtime_dir("phone-queue")
        self.dir = os.path.join(root, re.sub(r"[^A-Za-z0-9_.-]", "_", f"{tracker}-{key}"))
        self.stale_s = stale_s
        self._lock = threading.Lock()
        self._ticket = ""
        self._left = 0  # its calls that have not returned

    def start(self, n: int) -> str:
        """A batch of `n` measurements comes to the phones (ends this process's last one);
        its ticket ("" when unordered), for `wait`."""
        with self._lock:
            self._drop()
            if n <= 0:
                return ""
            self._ticket = os.path.join(self.dir, f"{time.time_ns():020d}-{os.getpid()}")
            self._left = n
            try:
                os.makedirs(self.dir, exist_ok=True)
                self._write()
            except OSError as e:  # no queue (a full or read-only /tmp): measure unordered
                log.warning("phones of %s: batches not ordered: %s", self.dir, e)
                self._ticket, self._left = "", 0
            return self._ticket

    @property
    def priority(self) -> int:
        """The batch's priority at the tracker (TVM's tracker serves the highest first, in
        request order among equals): the older the batch, the higher. A measurement of an
        older batch that asks a moment after a younger one still gets the next free phone."""
        name = os.path.basename(self._ticket)
        return -(int(name.split("-", 1)[0]) // 1_000_000) if name else 1

    def wait(self, ticket: str | None = None) -> float:
        """Before one measurement of the batch `ticket` (default: the current one) asks for a
        phone: wait while an older batch has measurements with no phone yet. A measurement
        of a batch that is over (the round abandoned it and started another) does not wait.
        Returns the seconds waited."""
        ticket = self._ticket if ticket is None else ticket
        t0 = touched = time.monotonic()
        while ticket and ticket == self._ticket and self._older_waiting(os.path.basename(ticket)):
            time.sleep(POLL_S)
            if time.monotonic() - touched > 1.0:  # waiting is not hanging: say so to the younger
                touched = time.monotonic()
                with contextlib.suppress(FileNotFoundError):
                    os.utime(ticket)
        return time.monotonic() - t0

    def returned(self, ticket: str) -> None:
        """A measurement call of batch `ticket` returned (measured, failed or killed at its
        deadline): once all have, the batch holds no one, settled or not."""
        with self._lock:
            if ticket and self._ticket == ticket and self._left > 0:
                self._left -= 1
                if not self._left:
                    self._drop()

    def end(self) -> None:
        """The batch is over (its measurements done or abandoned): it holds no one."""
        with self._lock:
            self._drop()

    def _write(self) -> None:
        tmp = f"{self._ticket}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(f"{self._left:010d}")
        os.replace(tmp, self._ticket)

    def _drop(self) -> None:
        if self._ticket:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self._ticket)
        self._ticket, self._left = "", 0

    def _older_waiting(self, mine: str) -> bool:
        try:
            names = sorted(n for n in os.listdir(self.dir) if not n.endswith(".tmp"))
        except FileNotFoundError:
            return False
        now = time.time()
        for name in names:
            if name >= mine:
                return False
            path = os.path.join(self.dir, name)
            try:
                pid = int(name.rsplit("-", 1)[1])
                if not _alive(pid):
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(path)  # its round process died: it holds no one
                    continue
                if now - os.stat(path).st_mtime > self.stale_s:
                    continue  # its round hangs: it holds no one
                with open(path, encoding="utf-8") as f:
                    if int(f.read() or 0) > 0:
                        return True
            except (OSError, ValueError, IndexError):
                continue  # it ended (removed) while we looked
        return False


def settle(ticket: str) -> None:
    """One measurement of batch `ticket` has its phone (or gave up asking): count it, in
    whichever process asked the tracker. Never fails the measurement."""
    if not ticket:
        return
    try:
        fd = os.open(ticket, os.O_RDWR)
    except OSError:
        return  # the batch is over (or unordered)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        left = int(os.pread(fd, 10, 0) or b"0")
        os.pwrite(fd, f"{max(0, left - 1):010d}".encode(), 0)  # same width: read whole
    except (OSError, ValueError) as e:
        log.warning("phones: batch %s not counted: %s", ticket, e)
    finally:
        os.close(fd)
