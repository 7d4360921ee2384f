"""`farm worker | tracker | phones | up | flower | devices | doctor`: the parts of a farm."""

# Imports inside functions: the CLI loads a command's modules when it runs (`farm
# --help` starts in ~0.15 s; `farm worker` loads the worker, `farm up` the services).

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from farm.client.common import config_of, store_of
from farm.core.config import FarmConfig
from farm.core.errors import UsageError
from farm.core.hostid import is_loopback
from farm.devices.lean import without_torch

if TYPE_CHECKING:
    from farm.local.services import ServiceGroup


def cmd_worker(args: argparse.Namespace) -> int:
    from workers.host.main import run_worker  # the CLI is the one place that starts a worker

    config = config_of(args, broker_url=args.broker, redis_url=args.redis,
                     worker_concurrency=args.concurrency, metrics_port=args.metrics_port,
                     metrics_host=args.metrics_host, lend_search=args.lend_search)
    keys = [k for k in (args.keys or "").split(",") if k]
    if args.helper:
        if args.tracker or keys:
            raise UsageError("a helper host has no tracker and no phones",
                             subject="farm worker --helper",
                             hint="leave out --tracker and --keys (or leave out --helper)")
        from workers.host.main import run_helper

        return run_helper(config, args.hostname, args.loglevel, args.pool)
    if not args.tracker:
        raise UsageError("a worker host needs its tracker", subject="farm worker",
                         hint="pass --tracker HOST:PORT (the TVM RPC tracker its phones "
                              "register with), or --helper for a host without phones")
    return run_worker(config, args.tracker, keys or None, args.hostname, args.loglevel, args.pool)


def cmd_tracker(args: argparse.Namespace) -> int:
    from farm.local.services import plain_env

    os.execve(sys.executable, [sys.executable, "-m", "farm.devices.rpcd", "tracker", "--verbose",
                               "--host", args.host, "--port", str(args.port)],
              without_torch(plain_env()))  # a tracker holds no secret of the farm
    return 0  # pragma: no cover


def cmd_phones(args: argparse.Namespace) -> int:
    from farm.local import services

    log_dir = Path(args.log_dir)
    group = services.ServiceGroup()
    try:
        config = config_of(args)
        from farm.devices.phone import advertised_address

        shown = (advertised_address(args.host, args.advertise, args.tracker)
                 or "the address they reach the tracker from")
        for i in range(args.count):
            group.add(services.start_phone(args.tracker, args.key, i, log_dir,
                                           services.PhoneOptions(
                                               threads=args.threads, arch=args.arch,
                                               host=args.host, advertise=args.advertise,
                                               opencl=args.opencl,
                                               work_group=args.work_group),
                                           config))
        from farm.devices.tracker import wait_for_phones

        wait_for_phones(args.tracker, args.key, args.count, timeout_s=300 if args.arch else 60)
        print(f"{args.count} emulated phones of key {args.key} on tracker {args.tracker}, "
              f"listening on {args.host}, advertised as {shown} "
              f"(logs in {log_dir}); Ctrl-C stops them", file=sys.stderr)
        while True:
            group.check_alive()
            time.sleep(1)
    finally:
        group.stop()


def cmd_up(args: argparse.Namespace) -> int:
    """A whole lab farm as local processes in the foreground: Redis (AOF), Flower, a tracker,
    emulated phones and a worker. Ctrl-C stops them all."""

    from farm.core.secrets import flower_auth, secret
    from farm.devices.tracker import wait_for_phones
    from farm.local import services

    args.redis_password = args.redis_password or secret("FARM_REDIS_PASSWORD")
    args.flower_auth = args.flower_auth or flower_auth()
    if not is_loopback(args.bind):
        missing = [what for what, value in (("FARM_REDIS_PASSWORD", args.redis_password),
                                            ("FARM_FLOWER_AUTH", args.flower_auth)) if not value]
        if missing:
            raise UsageError(f"binding {args.bind} (not loopback) needs {' and '.join(missing)}",
                             subject="farm up --bind",
                             hint="anyone who reaches an open Redis can forge records and run "
                                  "rounds; set them in the environment (not on the command "
                                  "line), or bind 127.0.0.1")
    config = config_of(args)
    home = Path(config.home)
    log_dir = home / "up-logs"
    group = services.ServiceGroup(pid_file=None)
    try:
        redis_svc, url = services.start_redis(home / "up-redis", log_dir, port=args.redis_port,
                                              host=args.bind, password=args.redis_password,
                                              maxmemory=config.redis_maxmemory)
        group.add(redis_svc)
        argv, env = flower_command(config, args.bind, args.flower_port, args.flower_auth,
                                   broker_url=url)
        group.add(services.start("flower", argv, log_dir, env))
        tracker_svc, tracker = services.start_tracker(log_dir, port=args.tracker_port)
        group.add(tracker_svc)
        for i in range(args.phones):
            group.add(services.start_phone(tracker, args.key, i, log_dir))
        wait_for_phones(tracker, args.key, args.phones, timeout_s=60)
        metrics, prometheus = _up_metrics(args, group, home, log_dir)
        group.add(services.start_worker(tracker, url, log_dir, extra=metrics))
        from farm.core.config import redact

        shown = redact(url)
        print(f"farm up: broker {shown}, flower http://{args.bind}:{args.flower_port}, "
              f"tracker {tracker}, {args.phones} phones of key {args.key}, logs in {log_dir}\n"
              + (f"prometheus {prometheus} scrapes the worker's and Flower's /metrics "
                 f"(Grafana: deploy/grafana/tunefarm.json)\n" if prometheus else "") +
              f"submit with: FARM_BROKER_URL={shown} farm submit MODEL --out DIR "
              f"--tracker {tracker}\nCtrl-C stops everything.", file=sys.stderr, flush=True)
        while True:
            group.check_alive()
            time.sleep(1)
    finally:
        group.stop()


def _up_metrics(args: argparse.Namespace, group: ServiceGroup, home: Path,
                log_dir: Path) -> tuple[list[str], str | None]:
    """With --prometheus-port: a Prometheus (loopback) scraping the worker's /metrics, started
    before the worker; returns the worker's metrics flags and Prometheus' URL."""
    if not args.prometheus_port:
        return [], None
    from farm.local import services

    port = services.free_port()
    # Flower's /metrics (its events, tasks, workers) needs no login: Prometheus reaches it
    # where Flower listens (on loopback when it listens everywhere)
    flower = "127.0.0.1" if args.bind in ("0.0.0.0", "::") else args.bind
    svc, url = services.start_prometheus(
        [f"127.0.0.1:{port}"], home / "up-prometheus", log_dir, args.prometheus_port,
        flower=f"{flower}:{args.flower_port}")
    group.add(svc)
    return ["--metrics-port", str(port), "--metrics-host", "127.0.0.1"], url


def flower_command(config: FarmConfig, address: str, port: int, auth: str | None,
                   broker_url: str | None = None) -> tuple[list[str], dict[str, str]]:
    """Flower's command line and the environment that carries its secrets (the broker URL
    with its password, the basic-auth credentials): never on the command line, which every
    user of the host sees in `ps`. Flower runs the farm's own Celery app
    (farm/client/flower_app.py: its key prefix, priority steps, result backend, so it shows
    the queues and a running round's PROGRESS state)."""
    argv = [sys.executable, "-m", "celery", "-A", "farm.client.flower_app", "flower",
            f"--address={address}", f"--port={port}", "--persistent=False"]
    broker = str(broker_url or config.broker_url)
    env = {"FARM_BROKER_URL": broker, "FARM_REDIS_URL": str(config.store_url or broker),
           "FARM_ROUND_TIMEOUT_S": str(config.round_timeout_s)}
    if auth:
        env["FLOWER_BASIC_AUTH"] = auth
    return argv, env


def cmd_flower(args: argparse.Namespace) -> int:
    """Flower on the farm's broker, loopback unless told otherwise, basic auth from
    $FARM_FLOWER_AUTH or Flower's own $FLOWER_BASIC_AUTH. Workers send task events (`-E`), so rounds show as they run."""

    config = config_of(args, broker_url=args.broker)
    if not config.broker_url:
        raise UsageError("Flower watches a lab farm", hint="set FARM_BROKER_URL or pass --broker")
    from farm.core.secrets import flower_auth

    auth = args.auth or flower_auth()
    if auth is None and not is_loopback(args.address):
        raise UsageError(f"Flower on {args.address} without basic auth",
                         hint="set FARM_FLOWER_AUTH=user:password (or Flower's own "
                              "FLOWER_BASIC_AUTH)")
    argv, env = flower_command(config, args.address, args.port, auth)
    os.execve(argv[0], argv, {**os.environ, **env})
    return 0  # pragma: no cover


def cmd_devices(args: argparse.Namespace) -> int:
    from farm.store import hosts, phones

    with store_of(args) as store:
        found = store.hosts()
        live = {p for h in found for addrs in h.addresses.values() for p in addrs}
        rows = phones.phone_rows(store.phone_stats(), live)
        if args.json:
            print(json.dumps({"hosts": [h.to_json() for h in found], "phones": rows}, indent=2))
        else:
            print(hosts.format_hosts(found) + "\n\n" + phones.format_phones(rows))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from farm.client.doctor import run_checks

    config = config_of(args, broker_url=args.broker)
    checks = run_checks(config, args.tracker, args.device_key or config.device_key)
    for c in checks:
        mark = ("WARN" if c.warn else "pass") if c.ok else "FAIL"
        print(f"[{mark}] {c.name}: {c.detail}"
              + ("" if c.ok and not c.warn else f"\n       fix: {c.fix}"))
    return 0 if all(c.ok for c in checks) else 5
