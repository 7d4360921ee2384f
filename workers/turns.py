"""A key's phones serve its batches in the order the batches came, host-wide.

Two rounds of a key run at once on a worker host so that one searches and builds while the
other's batch is on the phones (workers/gate.py). If both batches take phones as they free,
the phones serve them side by side: both end together, both rounds then search at the same
time and every phone waits for the host (bench/scaling.md, 2026-12-05: the rounds of a
4-phone run fell into step, utilization 0.72). Served one batch after the other, the
older batch ends a batch's time earlier, and its round searches its next one while the
phones serve the younger: the rounds stay out of step by themselves.

So before a measurement of a batch asks the tracker for a phone, it waits while an older
batch of the same tracker and key, in any process of this host, still has measurements
that have not asked: the older batch's requests are always the ones waiting at the
tracker when a phone frees. They also ask with a higher priority (the older the batch, the
higher), so an older batch's request that reaches the tracker a moment after a younger
one's still gets the next free phone. The wait is in the round process, before the measurement's
deadline starts (`run_timeout_s` counts from the request, not from the queue), and the
phones still go to whichever is free (a fast phone serves more).

Each batch is a file in a per-host directory, named by when the batch came (ns) and its
process, holding how many of its measurements have not asked yet. A batch whose process is
gone, or that has not moved for `stale_s` (a round that hangs), does not hold the others.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
import threading
import time

log = logging.getLogger(__name__)
QUEUE_DIR = os.path.join(tempfile.gettempdir(), f"farm-phone-queue-{os.getuid()}")
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
        self.dir = os.path.join(root, re.sub(r"[^A-Za-z0-9_.-]", "_", f"{tracker}-{key}"))
        self.stale_s = stale_s
        self._lock = threading.Lock()
        self._ticket = ""
        self._left = 0

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
        phone: wait while an older batch has measurements that have not asked; then count
        this one as asked. A measurement of a batch that is over (the round abandoned it and
        started another) neither waits nor counts. Returns the seconds waited."""
        ticket = self._ticket if ticket is None else ticket
        t0 = touched = time.monotonic()
        while ticket and ticket == self._ticket and self._older_waiting(os.path.basename(ticket)):
            time.sleep(POLL_S)
            if time.monotonic() - touched > 1.0:  # waiting is not hanging: say so to the younger
                touched = time.monotonic()
                with contextlib.suppress(FileNotFoundError):
                    os.utime(ticket)
        with self._lock:
            if ticket and self._ticket == ticket and self._left > 0:
                self._left -= 1
                if self._left:
                    self._count()
                else:
                    self._drop()
        return time.monotonic() - t0

    def end(self) -> None:
        """The batch is over (its measurements done or abandoned): it holds no one."""
        with self._lock:
            self._drop()

    def _write(self) -> None:
        tmp = f"{self._ticket}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(str(self._left))
        os.replace(tmp, self._ticket)

    def _count(self) -> None:
        with contextlib.suppress(OSError):  # the count is an order, never a must
            self._write()

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
