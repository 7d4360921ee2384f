"""A worker host's heartbeat, and queue subscriptions that follow the phones on its tracker.

Runs as a thread of the worker's main process: every `interval_s` it reads the
tracker, publishes a `HostBeat` (expiring after the config's host_ttl_s), and when phones
of a new key appear, or the last phone of a key leaves, it adds or cancels that
key's queue with Celery's add_consumer / cancel_consumer.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from farm.core.aliases import CeleryApp
from farm.core.config import FarmConfig, redact
from farm.core.cores import usable_cores
from farm.core.errors import ServiceError, best_effort
from farm.core.hostid import machine
from farm.devices import tracker as tracker_mod
from farm.devices.hostcpu import system_cpu
from farm.jobs.dispatch import queue_for
from farm.store.hosts import HostBeat
from farm.store.store import FarmView
from workers.round.gate import cores_needed, phone_speed

if TYPE_CHECKING:
    from farm.store.cold import Archive
    from workers.round.gate import Gate

log = logging.getLogger(__name__)
ARCHIVE_READ_S = 300.0  # a host reads its archive's id again this often


@dataclass(frozen=True)
class WorkerHost:
    """A worker host as its heartbeat tells it: its node name, its tracker, the queues it
    consumes when it starts, whether they follow the keys of the tracker's phones (no
    --keys given), and a helper's search sessions at once."""

    node: str
    tracker: str
    queues: frozenset[str]
    follow_tracker: bool
    searches: int = 0


class Heartbeat(threading.Thread):
    def __init__(self, app: CeleryApp, store: FarmView, host: WorkerHost, config: FarmConfig,
                 gate: Gate | None = None, interval_s: float | None = None) -> None:
        super().__init__(name=f"heartbeat-{host.node}", daemon=True)
        self.app = app
        self.store = store  # thread-safe: redis-py's client pools its connections
        self.node = host.node
        self.tracker = host.tracker
        self.queues = set(host.queues)
        self.follow = host.follow_tracker
        self.searches = host.searches
        self.ttl_s = config.host_ttl_s  # a beat expires after this
        self.interval_s = interval_s if interval_s is not None else max(1.0, self.ttl_s / 3)
        self.started_at = time.time()
        self.counted_at = time.monotonic()  # phones' work time is counted up to here
        # a key's queue is kept this long after its last phone left (a round that starts
        # meanwhile waits that long for a phone)
        self.grace_s = config.device_wait_s
        self.last_seen: dict[str, float] = {q: time.time() for q in host.queues}
        self.gate = gate  # workers/round/gate.py: the rounds of each key running now
        self.stopping = threading.Event()
        self.archive_seen = ("", "", -ARCHIVE_READ_S)  # (id, error, when read)

    def beat(self) -> None:
        found: dict[str, tracker_mod.KeyInfo] = {}
        try:
            if self.tracker:  # a helper host has none
                found = tracker_mod.phones(self.tracker)
        except ServiceError as e:
            log.warning("worker %s: tracker %s unreachable: %s", self.node, self.tracker, e)
        phones = {k: {"total": v.total, "free": v.free, "busy": max(0, v.total - v.free)}
                  for k, v in found.items()}
        if self.follow:
            self._follow({k for k, v in found.items() if v.total > 0})
        self._count_work(found)
        self.store.publish_host(HostBeat(
            name=self.node, tracker=self.tracker, phones=phones, queues=sorted(self.queues),
            pid=os.getpid(), started_at=self.started_at, beat_at=time.time(),
            cpu=system_cpu(), addresses={k: list(v.phones) for k, v in found.items()},
            rounds={k: self.gate.running(k) for k in found} if self.gate is not None else {},
            machine=machine(), searches=self.searches, cores=usable_cores(),
            cores_needed=self._cores_needed(found), **self._archive()),
            ttl_s=self.ttl_s)

    def _cores_needed(self, found: dict[str, tracker_mod.KeyInfo]) -> dict[str, float]:
        """Per key: the cores its phones need of this host (a gated host measures its rounds'
        CPU; workers/round/gate.py), where measured."""
        if self.gate is None or not found:
            return {}

        host_s, out = self.gate.host_s(), {}
        for key, info in found.items():
            need = cores_needed(host_s, phone_speed(self.store, key, info.phones),
                                len(info.phones))
            if need is not None:
                out[key] = round(need, 2)
        return out

    def _archive(self) -> dict[str, str]:
        """The archive this host's records go to and its id, read again every few minutes
        (`farm doctor` checks that a lab's hosts share one)."""
        archive = self.store.archive
        if archive is None:
            return {}
        ident, error, read_at = self.archive_seen
        if time.monotonic() - read_at >= ARCHIVE_READ_S:
            # read aside: a slow or hanging archive (NFS, object store) never delays a beat
            self.archive_seen = (ident, error, time.monotonic())
            threading.Thread(target=self._read_archive, args=(archive,), daemon=True,
                             name=f"archive-id-{self.node}").start()
        return {"archive": redact(archive.url), "archive_id": ident, "archive_error": error}

    def _read_archive(self, archive: Archive) -> None:
        try:
            ident, error = archive.identity(), ""
        except Exception as e:  # noqa: BLE001 - reported in the beat, never fatal
            ident, error = "", f"{type(e).__name__}: {e}"[:300]
        self.archive_seen = (ident, error, self.archive_seen[2])

    def _count_work(self, found: dict[str, tracker_mod.KeyInfo]) -> None:
        """Add the time since the last beat to the work time of every phone on the tracker whose
        key has work (a job of the key with a task queued or tuning): its idle time is that
        minus its busy time (farm/store/phones.py)."""
        now = time.monotonic()
        elapsed, self.counted_at = min(now - self.counted_at, float(self.ttl_s)), now
        busy_keys = set()
        for job_id in self.store.active_jobs():
            job = self.store.get_job(job_id)
            if job is not None and job.device_key in found and job.device_key not in busy_keys \
                    and any(s.outstanding for s in self.store.task_states(job_id).values()):
                busy_keys.add(job.device_key)
        for key in sorted(busy_keys):
            for phone in found[key].phones:
                self.store.add_phone_work(key, phone, self.node, elapsed)

    def _follow(self, keys_now: set[str]) -> None:
        """Consume the queues of the keys with phones; keep a key's queue for `grace_s` after
        its last phone left (a phone app restarting should not unsubscribe the host: a round
        that starts meanwhile waits for a phone, bounded, and says so)."""
        now = time.time()
        wanted = {queue_for(k) for k in keys_now}
        for q in wanted:
            self.last_seen[q] = now
        for q in sorted(wanted - self.queues):
            log.info("worker %s: phones of a new key appeared: consuming %s", self.node, q)
            self.app.control.add_consumer(q, destination=[self.node], reply=False)
            self.queues.add(q)
        for q in sorted(self.queues - wanted):
            if now - self.last_seen.get(q, 0.0) < self.grace_s:
                continue
            log.info("worker %s: no phone for %s for %.0f s: cancelling it", self.node, q,
                     now - self.last_seen.get(q, 0.0))
            self.app.control.cancel_consumer(q, destination=[self.node], reply=False)
            self.queues.discard(q)

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.beat()
            except Exception as e:  # noqa: BLE001 - a heartbeat never kills the worker
                log.warning("worker %s: heartbeat failed (will retry): %s", self.node, e)
            self.stopping.wait(self.interval_s)
        best_effort(self.store.remove_host, self.node)  # it expires anyway

    def stop(self) -> None:
        self.stopping.set()
