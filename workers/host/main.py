"""`farm worker`: a worker host bound to one tracker, consuming the queues of its device keys."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import socket
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from farm.core import hostid
from farm.core.config import FarmConfig
from farm.core.cores import usable_cores
from farm.core.errors import ServiceError
from farm.core.profiles import resolve_profile
from farm.devices import tracker as tracker_mod
from farm.devices.lean import hide_torch
from farm.jobs.dispatch import SEARCH_QUEUE, queue_for
from farm.jobs.supervisor import Supervisor
from farm.store import RecordStore, configured_store, open_broker
from farm.store.broker import BrokerQueues
from farm.store.hosts import HostRegistry
from farm.store.store import FarmView, RecordsAndJobs
from workers.host.heartbeat import Heartbeat, WorkerHost
from workers.host.metrics import FarmCollector, serve
from workers.host.round_times import RoundTimes, multiprocess_folder
from workers.round.context import preload
from workers.round.gate import LEND_ROUNDS, Gate, pool_size

if TYPE_CHECKING:
    from farm.core.aliases import CeleryApp
    from farm.jobs.supervisor import Supervisor

log = logging.getLogger(__name__)


def run_worker(config: FarmConfig, tracker: str, keys: list[str] | None = None,
               hostname: str | None = None, loglevel: str = "INFO", pool: str = "prefork") -> int:
    """Check the tracker and the broker, then run the Celery worker in the foreground."""
    if not config.broker_url:
        raise ServiceError("no broker configured", subject="farm worker",
                           hint="pass --broker redis://HOST:6379/0 or set FARM_BROKER_URL")
    store = configured_store(config)  # one client for the heartbeat, supervisor, metrics
    store.ping()
    found = tracker_mod.phones(tracker)  # raises with the address and how to check it
    explicit_keys = bool(keys)
    if not explicit_keys:  # a lab's phones come and go: wait for the first, do not give up
        found = first_phones(tracker, found)
    keys = keys or sorted(k for k, v in found.items() if v.total > 0)
    gated = config.worker_concurrency == 0
    config, lend_room = _concurrency(config, keys)
    name = hostname or default_name()
    if hostname:  # refused before TVM is loaded below
        check_name_free(store, name, config.host_ttl_s)
    # here: Celery and TVM load after the cheap checks (a name held, a tracker away) have answered
    from workers.host.app import build_app
    hide_torch()  # only now: a worker refused above leaves its caller as it was (lean.py)
    if pool == "prefork":  # pool children fork from here: warm, not importing TVM each
        _preload()
    gate_dir = tempfile.mkdtemp(prefix="farm-gate-") if gated else None  # its pool's slots
    if gate_dir:
        Gate(gate_dir, config.worker_concurrency).set_lend_room(lend_room)
    app = build_app(config, tracker, name, gate_dir=gate_dir)
    queues = {queue_for(k) for k in keys}
    log.info("worker %s: tracker %s, keys %s", name, tracker, ", ".join(keys))
    beat = Heartbeat(app, store, WorkerHost(name, tracker, frozenset(queues),
                                            follow_tracker=not explicit_keys), config,
                     gate=Gate(gate_dir, config.worker_concurrency) if gate_dir else None)
    beat.beat()
    beat.start()
    broker = open_broker(str(config.broker_url))
    supervisor = _supervisor(app, store, broker, name, config)
    metrics = serve_metrics(config, store, broker, name, supervisor) \
        if config.metrics_port else None
    try:
        _serve(app, sorted(queues), name, config, (loglevel, pool))
    finally:
        _stop(supervisor, beat, store)
        for folder in (gate_dir, metrics):
            if folder:
                shutil.rmtree(folder, ignore_errors=True)
    return 0


def _supervisor(app: CeleryApp, store: RecordsAndJobs, broker: BrokerQueues, name: str,
                config: FarmConfig) -> Supervisor:
    """This host's supervisor (farm/jobs/supervisor.py), started: it leads the farm's sweeps
    when it holds the leader lock."""
    supervisor = Supervisor(app, store, broker, name, interval_s=config.supervisor_interval_s,
                            grace_s=float(config.host_ttl_s))
    supervisor.retention_days = config.archive_retention_days
    supervisor.start()
    return supervisor


def _serve(app: CeleryApp, queues: list[str], name: str, config: FarmConfig,
           log: tuple[str, str]) -> None:
    """Celery's worker in the foreground, consuming `queues` (`log`: its loglevel and pool)."""
    loglevel, pool = log
    app.worker_main(argv=["worker", "-Q", ",".join(queues), "-c",
                          str(config.worker_concurrency), "-n", name, "--loglevel", loglevel,
                          "-E", "-P", pool, "--without-mingle", "--without-gossip"])


def _stop(supervisor: Supervisor, beat: Heartbeat, store: RecordStore) -> None:
    supervisor.stop()
    beat.stop()
    beat.join(timeout=10)
    store.close()


def run_helper(config: FarmConfig, hostname: str | None = None, loglevel: str = "INFO",
               pool: str = "prefork") -> int:
    """A helper host: no tracker, no phones; it takes the search and builds of rounds whose
    phone hosts are short of cores (workers/round/lend/helper_side.py). Rounds at once: its Celery
    concurrency (default: its cores, at least 2: a lent round waits while the phones measure)."""
    if not config.broker_url:
        raise ServiceError("no broker configured", subject="farm worker --helper",
                           hint="pass --broker redis://HOST:6379/0 or set FARM_BROKER_URL")

    store = configured_store(config)
    store.ping()
    name = hostname or default_name()
    if hostname:
        check_name_free(store, name, config.host_ttl_s)
    if config.worker_concurrency == 0:
        config = replace(config, worker_concurrency=max(2, usable_cores()))
    # here: Celery and TVM load after the cheap checks (a name held, a tracker away) have answered
    from workers.host.app import build_app
    hide_torch()
    if pool == "prefork":
        _preload()
    app = build_app(config, "", name)
    log.info("helper %s: searching and building for phone hosts (%d at once)", name,
             config.worker_concurrency)
    beat = Heartbeat(app, store, WorkerHost(name, "", frozenset({SEARCH_QUEUE}), False,
                                             config.worker_concurrency), config)
    beat.beat()
    beat.start()
    supervisor = _supervisor(app, store, open_broker(str(config.broker_url)), name, config)
    try:
        _serve(app, [SEARCH_QUEUE], name, config, (loglevel, pool))
    finally:
        _stop(supervisor, beat, store)
    return 0


def serve_metrics(config: FarmConfig, store: FarmView, broker: BrokerQueues, name: str,
                  supervisor: Supervisor) -> str:
    """This host's /metrics (workers/host/metrics.py): the farm-wide series while its
    supervisor leads, its own, and its rounds' times, observed in the pool processes about
    to fork (workers/host/round_times.py). Returns the folder of their files (the worker
    removes it when it ends)."""

    folder = multiprocess_folder(Path(config.home))
    try:
        RoundTimes(config, name).connect()
        serve(FarmCollector(store, broker, name, leads=lambda: supervisor.leading),
              config.metrics_host, config.metrics_port, multiprocess=folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def default_name() -> str:
    """This start's node name: the host name to read, and an id of this machine, process and
    start (a host name alone is shared by cloned machines and `compose --scale` replicas:
    their heartbeats overwrote each other and both led the farm)."""
    start = hashlib.sha1(f"{hostid.machine()}|{os.getpid()}|{time.time_ns()}".encode()).hexdigest()
    return f"farm@{socket.gethostname()}-{start[:6]}"


def check_name_free(store: HostRegistry, name: str, ttl_s: float) -> None:
    """A name given with --hostname that a live worker of another machine or process holds is
    refused: two hosts of one name are one host to the farm. A heartbeat left by a process of
    this machine that is gone (a restart) frees the name at once; one from elsewhere is
    watched for up to a heartbeat's time to live: a live host beats again, a dead one's beat
    expires."""
    import psutil

    deadline, first = time.monotonic() + ttl_s + 2, None
    while True:
        beat = next((b for b in store.hosts() if b.name == name), None)
        if beat is None or (beat.machine, beat.pid) == (hostid.machine(), os.getpid()):
            return
        if beat.machine == hostid.machine() and not psutil.pid_exists(beat.pid):
            return  # this machine's earlier worker of this name, gone
        first = beat.beat_at if first is None else first
        if beat.beat_at != first or time.monotonic() > deadline:
            raise ServiceError(f"a live worker host already has this name (pid {beat.pid} on "
                               f"{beat.machine or 'an older farm'}): two hosts of one name "
                               "overwrite each other's heartbeat and both lead the farm",
                               subject=f"worker {name}",
                               hint="give each host its own --hostname, or leave it out (a "
                                    "name unique to this start)")
        time.sleep(1.0)


def first_phones(tracker: str, found: dict, poll_s: float = 2.0,
                 say_every_s: float = 60.0) -> dict:
    """The tracker's phones once at least one has registered (a host's phones reboot, its USB
    hub resets, the worker starts first): says so meanwhile, every `say_every_s`. A tracker
    that goes away raises (tracker_mod.phones says where and how to check)."""
    said = -say_every_s
    t0 = time.monotonic()
    while not any(v.total > 0 for v in found.values()):
        if time.monotonic() - said >= say_every_s:
            said = time.monotonic()
            log.warning("worker: no phone registered at tracker %s yet (%.0f s): waiting for "
                        "phones (`farm phones --key K --tracker %s`, or a phone's RPC app "
                        "pointed at it); --keys K starts serving K without waiting", tracker,
                        said - t0, tracker)
        time.sleep(poll_s)
        found = tracker_mod.phones(tracker)
    if time.monotonic() - t0 > poll_s:
        log.warning("worker: phones registered at tracker %s: keys %s", tracker,
                    ", ".join(sorted(k for k, v in found.items() if v.total > 0)))
    return found


def _preload() -> None:

    t0 = time.monotonic()
    preload()
    log.info("worker: TVM loaded in %.1f s (before the pool forks)", time.monotonic() - t0)


def _concurrency(config: FarmConfig, keys: list[str]) -> tuple[FarmConfig, int]:
    """The worker's pool, when not set: room for two rounds per device key (workers/round/gate.py
    decides per key whether one or two run at once, from the measured speeds), and for
    LEND_ROUNDS more lent to helper hosts when its phones may lend (the second value)."""
    if config.worker_concurrency != 0:
        return config, 0

    # phones of their own (not this host's CPU) may lend their rounds' search to helpers
    lends = config.lend_search != "never" and any(
        not resolve_profile(k, config.profiles).host_cpu for k in keys)
    size = pool_size(len(keys), lends)
    log.info("worker: %d device key(s), a pool of %d round processes; rounds at once follow "
             "the measured speeds of the phones and of this host (%d usable cores of %d: "
             "affinity and cgroup quota)%s", len(keys), size, usable_cores(),
             os.cpu_count() or 1, "; room for rounds lent to helper hosts" if lends else "")
    return replace(config, worker_concurrency=size), LEND_ROUNDS if lends and keys else 0
