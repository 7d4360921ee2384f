"""A round's fence: at most one copy of a round runs at a time, none runs after it is done,
and a round that keeps killing its process is given up (a poison round).

Delivery is at-least-once (acks_late, a redelivery after a dead worker, a copy the
supervisor sends again), measurement must be at-most-once. Every copy of a round
shares the round's logical id (`RoundRequest.logical_id`); before it measures, a copy
takes the round's lease in the store (atomic SET-if-free, see farm/store/redis/lease.lua):

- the round is done (`finish_round`, written by the lease's holder only): the copy does
  not run;
- another live copy holds the lease: the copy does not run;
- the holder was a process of this machine that is gone (its pool child was killed):
  the copy takes the lease over and runs;
- otherwise the copy holds the lease while it runs. A thread renews it every third of
  its time to live; a copy that cannot renew it (the store unreachable for a whole TTL, or
  another copy took it) is told to stop at its next batch.

The lease expires one TTL (the config's host_ttl_s, the heartbeat's) after its process died, so
the supervisor (farm/jobs/supervisor.py) sees the round as not live and sends it again.

Thread safety: one `RoundFence` per running copy; `lost` is read by the round's thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field

import psutil

from farm.core.errors import TuneError
from farm.core.hostid import machine
from farm.core.messages import RoundRequest
from farm.store.coordination import Coordination

log = logging.getLogger(__name__)

POISON_AFTER = 3  # a round whose process died this many times fails its task


class RoundStopped(TuneError):
    """The round lost its lease (another copy took it, or the store was unreachable for a
    whole lease): it stops measuring at once so that two copies never measure together."""


def owner_of(req: RoundRequest, node: str) -> str:
    """Who holds a round's lease: this copy, the worker node, this machine and process."""
    return f"{req.round_id}|{node}|{machine()}|{os.getpid()}"


def holder_is_dead(holder: str) -> bool:
    """Is the lease's holder a process of this machine that no longer runs?

    A holder on another machine is alive until its lease expires (we cannot look)."""
    parts = holder.rsplit("|", 2)
    if len(parts) != 3 or parts[1] != machine():
        return False
    try:
        pid = int(parts[2])
    except ValueError:
        return False
    if pid == os.getpid():
        return False  # this very process: a copy of ours that did not end cleanly
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@dataclass
class RoundFence:
    """The lease of one running copy of a round. Use `enter()`, then `exit()` in a finally."""

    store: Coordination
    req: RoundRequest
    node: str
    ttl_s: float
    owner: str = ""
    crashes: int = 0  # earlier starts of this round that killed their process
    took_over: bool = False  # from a copy whose process died holding the round
    lost: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def enter(self) -> str:
        """Take the round. Returns "run", "done" (it ran to its end already) or the holder
        of a live copy (the caller does not run the round)."""
        logical = self.req.logical_id
        if self.store.round_is_done(logical):
            return "done"
        self.owner = owner_of(self.req, self.node)
        holder = self.store.acquire_round(logical, self.owner, self.ttl_s)
        if holder is not None and holder_is_dead(holder):
            log.warning("round %s: its last holder (%s) died; taking it over", logical, holder)
            holder = self.store.acquire_round(logical, self.owner, self.ttl_s, dead_holder=holder)
            self.took_over = holder is None
        if holder is not None:
            return holder
        self.crashes = self.store.round_started(logical)
        self._thread = threading.Thread(target=self._renew, daemon=True,
                                        name=f"lease-{self.req.round_id}")
        self._thread.start()
        return "run"

    @property
    def poisoned(self) -> bool:
        return self.crashes >= POISON_AFTER

    def check(self) -> None:
        """Raise RoundStopped when the lease was lost (called between batches)."""
        if self.lost.is_set():
            raise RoundStopped("the round's lease was lost (another copy runs it, or the store "
                               "was unreachable for a whole lease); stopped before measuring "
                               "more", subject=f"round {self.req.round_id}")

    def _renew(self) -> None:
        last_ok = time.monotonic()
        while not self._stop.wait(self.ttl_s / 3):
            try:
                holder = self.store.acquire_round(self.req.logical_id, self.owner, self.ttl_s)
            except Exception as e:  # noqa: BLE001 - the store restarting: retry until the TTL
                if time.monotonic() - last_ok >= self.ttl_s:
                    log.error("round %s: lease not renewed for %.0f s (%s): stopping",
                              self.req.round_id, self.ttl_s, e)
                    self.lost.set()
                    return
                continue
            if holder is not None:
                log.error("round %s: lease taken by %s: stopping", self.req.round_id, holder)
                self.lost.set()
                return
            last_ok = time.monotonic()

    def exit(self, done: bool) -> bool:
        """Stop renewing; count the end; with `done`, no copy of the round runs again. Returns
        True when this copy, still the holder of the fence, marked the round done: only then
        may it move the job on (its next round, the task's state). Best effort: the store may
        be down (the lease then expires by itself, and the supervisor sends the round again)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        logical, finished = self.req.logical_id, False
        try:
            self.store.round_ended(logical)
            if done:
                finished = self.store.finish_round(logical, self.owner)
                if not finished:
                    log.warning("round %s: another copy holds it now (%s): this copy's records "
                                "are kept, the job goes on from that copy", self.req.round_id,
                                self.store.round_holder(logical))
            else:
                self.store.release_round(logical, self.owner)
        except Exception as e:  # noqa: BLE001 - see the docstring
            log.warning("round %s: fence write failed (ignored): %s", self.req.round_id, e)
        return finished
