"""The embedded default: a whole farm on this machine, for one command's lifetime.

A private Redis (AOF in $FARM_HOME/redis, so the record store survives between
runs), a TVM RPC tracker, emulated phones and one worker, all on free loopback
ports, all stopped on exit, on error and on Ctrl-C.

Measurement is kept clean on a small machine: each phone runs kernels on one
thread (TVM_NUM_THREADS=1) and the worker builds, then measures (MetaSchedule's
order), so builds and measurements do not share cores at the same moment.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from farm.core.aliases import JsonDict
from farm.core.config import _ENV, FarmConfig, redact
from farm.core.errors import ServiceError
from farm.devices.tracker import wait_for_phones
from farm.local import services
from farm.store import RecordStore, configured_store

log = logging.getLogger(__name__)


@dataclass
class EmbeddedFarm:
    broker_url: str
    tracker: str
    group: services.ServiceGroup
    log_dir: Path
    phones_ready: Callable[[], None]  # blocks until its phones registered, or raises


def config_env(config: FarmConfig) -> dict[str, str]:
    """The FARM_* environment that gives a child process the same config."""

    env = {}
    for name, var in _ENV.items():
        value = getattr(config, name)
        if value is not None and name not in ("broker_url", "redis_url"):
            env[var] = str(value)
    if config.config_file is not None:  # its profiles and settings (--config FILE too)
        env["FARM_CONFIG"] = str(config.config_file)
    return env


_OURS = ("tvm.exec", "farm.devices.phone", "rpcd", "tvm_rpc", "redis-server", "-m farm ", "celery")


def reap_orphans(home: Path) -> list[int]:
    """Stop what an embedded farm under `home` left behind when its `farm` process was killed
    outright (SIGKILL): every process still in the process group of a service it listed.
    Returns the PIDs signalled. Only process groups we started, checked by command line."""
    import signal

    import psutil

    reaped: list[int] = []
    for pid_file in (home / "logs").glob("*/pids"):
        owner = int(pid_file.parent.name) if pid_file.parent.name.isdigit() else -1
        if owner == os.getpid() or psutil.pid_exists(owner):
            continue  # that farm is still alive (or it is us)
        groups = {int(line.split()[0]) for line in pid_file.read_text().splitlines() if line}
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                pgid = os.getpgid(proc.pid)
            except (ProcessLookupError, PermissionError):
                continue
            cmd = " ".join(proc.info["cmdline"] or [])
            if pgid in groups and any(mark in cmd for mark in _OURS):
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                    os.kill(proc.pid, signal.SIGKILL)
                    reaped.append(proc.pid)
                except ProcessLookupError:
                    pass
        pid_file.rename(pid_file.with_name("pids.reaped"))
    if reaped:
        log.warning("embedded farm in %s: stopped %d processes left by a killed run: %s", home,
                    len(reaped), reaped)
    return reaped


# How long a command waits for FARM_HOME's lock held by a short-lived holder (`farm status`,
# `farm cache` start the store's Redis for a few seconds) or by a farm still starting up.
LOCK_WAIT_S = 60.0


def _holder(home: Path) -> JsonDict:
    try:
        return json.loads((home / "embedded.lock").read_text() or "{}")
    except (OSError, ValueError):
        return {}


def _try_lock(home: Path, purpose: str) -> IO[str] | None:
    """FARM_HOME's lock, taken for `purpose` ("farm" or "store"), or None when it is held.
    FARM_HOME is this user's only (0700): it holds the store and the Redis password."""
    services.private_dir(home)
    lock = open(home / "embedded.lock", "a+")  # noqa: SIM115 - held for the holder's life
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    lock.truncate(0)
    lock.write(json.dumps({"pid": os.getpid(), "purpose": purpose}))
    lock.flush()
    return lock


def _busy(home: Path) -> ServiceError:
    return ServiceError("another embedded farm is running on this FARM_HOME", subject=str(home),
                        hint="wait for it, or set FARM_HOME to another folder")


def _farm_holds(home: Path) -> bool:
    """A live `farm submit` (not a brief `farm status`) holds FARM_HOME."""
    import psutil

    holder = _holder(home)
    return holder.get("purpose") == "farm" and holder.get("pid") != os.getpid() \
        and psutil.pid_exists(int(holder.get("pid", -1)))


@contextlib.contextmanager
def _home_lock(home: Path, lock: IO[str]) -> Iterator[Path]:
    """While `lock` (FARM_HOME's, from _try_lock or _farm_lock: one Redis per FARM_HOME owns
    the AOF files there) is held: reaps what a killed run left, yields this process's log
    folder; releases the lock at the end."""
    try:
        reap_orphans(home)
        log_dir = home / "logs" / str(os.getpid())
        log_dir.mkdir(parents=True, exist_ok=True)
        yield log_dir
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


def _farm_lock(home: Path) -> IO[str]:
    """The lock for an embedded farm: fails at once when another farm runs on `home`, waits
    (up to LOCK_WAIT_S) while a `farm status` or `farm cache` briefly holds it."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while (lock := _try_lock(home, "farm")) is None:
        if _farm_holds(home) or time.monotonic() > deadline:
            raise _busy(home)
        time.sleep(0.2)
    return lock


def running_farm_url(home: Path) -> str | None:
    """The Redis URL of an embedded farm running now on `home` (another `farm submit`)."""
    import psutil

    try:
        info = json.loads((home / "running.json").read_text())
    except (OSError, ValueError):
        return None
    return info.get("broker_url") if psutil.pid_exists(int(info.get("pid", -1))) else None


def new_password() -> str:
    """The embedded Redis's password: new at every start (processes of this user on this
    machine get it from running.json or their environment; nobody else reaches the store)."""
    import secrets

    return secrets.token_hex(16)


@contextlib.contextmanager
def farm_store(config: FarmConfig) -> Iterator[RecordStore]:
    """The farm's record store for a moment: the lab farm's (config.store_url), or the
    embedded farm's Redis (`embedded_store_url`); pinged, closed after."""

    with contextlib.ExitStack() as stack:
        url = config.store_url or stack.enter_context(embedded_store_url(config))
        store = configured_store(config, url)
        stack.callback(store.close)
        store.ping()
        yield store


@contextlib.contextmanager
def embedded_store_url(config: FarmConfig) -> Iterator[str]:
    """The embedded farm's Redis (for `farm cache`, `farm status` without a lab farm): the
    running farm's when a `farm submit` is running on this FARM_HOME (waiting for its Redis
    if it is starting up), else started for now."""
    home = Path(config.home)
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        url = running_farm_url(home)
        if url is not None:
            yield url
            return
        lock = _try_lock(home, "store")
        if lock is not None:
            break
        if time.monotonic() > deadline:
            raise _busy(home)
        time.sleep(0.2)
    with _home_lock(home, lock) as log_dir:
        group = services.ServiceGroup(pid_file=log_dir / "pids")
        try:
            svc, url = services.start_redis(home / "redis", log_dir, password=new_password())
            group.add(svc)
            yield url
        finally:
            group.stop()


@contextlib.contextmanager
def embedded_farm(config: FarmConfig, threads: int = 1, arch: str = "",
                  wait: bool = True, opencl: bool = False) -> Iterator[EmbeddedFarm]:
    """The embedded farm, its services started (with `opencl`, its phones have an OpenCL
    device: farm/devices/opencl.py). With `wait`, its phones have registered when it is
    yielded; without, they may still be starting (call its `phones_ready` before use): the
    client reads the model meanwhile."""
    home = Path(config.home)
    with _home_lock(home, _farm_lock(home)) as log_dir, \
            _services(config, home, log_dir, threads, arch, opencl) as farm:
        if wait:
            farm.phones_ready()
        yield farm


@contextlib.contextmanager
def _services(config: FarmConfig, home: Path, log_dir: Path, threads: int,
              arch: str = "", opencl: bool = False) -> Iterator[EmbeddedFarm]:
    """Redis, the tracker, the phones and the worker, started at once: the worker serves the
    profile's key (`--keys`), so it warms up while the phones register (an emulated phone
    imports TVM first: ~2 s here, 10-60 s under qemu)."""
    group = services.ServiceGroup(pid_file=log_dir / "pids")
    with contextlib.ExitStack() as stack:
        stack.callback(group.stop)
        redis = functools.partial(services.start_redis, home / "redis", log_dir,
                                  password=new_password(), maxmemory=config.redis_maxmemory)
        redis_svc, url = redis()
        port = int(url.rsplit(":", 1)[1].split("/")[0])  # a dead Redis comes back there, its
        group.add(redis_svc).restart = lambda: redis(port=port)[0]  # store from its AOF
        running = home / "running.json"  # `farm status` elsewhere reads this farm's store
        services.write_private(running, json.dumps({"pid": os.getpid(), "broker_url": url}))
        stack.callback(running.unlink, missing_ok=True)
        tracker_svc, tracker = services.start_tracker(log_dir)
        tport = int(tracker.rsplit(":", 1)[1])  # a dead tracker comes back there: phones register
        group.add(tracker_svc).restart = lambda: services.start_tracker(log_dir, port=tport)[0]
        for i in range(config.phones):
            phone = functools.partial(services.start_phone, tracker, config.device_key, i,
                                      log_dir, services.PhoneOptions(
                                          threads=threads, arch=arch,
                                          delay_s=config.phone_delay_s,
                                          port=services.free_port(), opencl=opencl,
                                          work_group=config.phone_work_group,
                                          heat_after_s=config.phone_heat_after_s if i == 0
                                          else 0.0), config)
            group.add(phone()).restart = phone  # a phone that dies is started again, same port
        worker = functools.partial(services.start_worker, tracker, url, log_dir,
                                   env=config_env(config), extra=["--keys", config.device_key])
        group.add(worker()).restart = worker  # as a lab's systemd does (deploy/)
        log.info("embedded farm: redis %s, tracker %s, %d phones of %s, logs in %s", redact(url),
                 tracker, config.phones, config.device_key, log_dir)
        yield EmbeddedFarm(broker_url=url, tracker=tracker, group=group, log_dir=log_dir,
                           phones_ready=lambda: _phones_ready(config, tracker, group, arch))


def _phones_ready(config: FarmConfig, tracker: str, group: services.ServiceGroup,
                  arch: str) -> None:
    """Wait for the embedded farm's phones to register; a phone or worker that exited is
    reported as such (with its log), not as a timeout."""

    # an emulated arm64 phone imports TVM under qemu before it registers (~10-60 s)
    wait_for_phones(tracker, config.device_key, config.phones, timeout_s=300 if arch else 60,
                    check=group.check_alive)
