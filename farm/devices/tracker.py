"""A TVM RPC tracker as the farm sees it: which phones (RPC servers) of which keys it has."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from farm.core.aliases import RPCSession
from farm.core.errors import ServiceError, UsageError
from farm.core.hostid import is_loopback, short_machine


@dataclass(frozen=True)
class KeyInfo:
    total: int  # phones registered under the key
    free: int  # phones not in a session
    pending: int  # session requests waiting
    hosts: tuple[str, ...] = ()  # the phones' hosts, as they registered
    phones: tuple[str, ...] = ()  # each phone's "host:port" (request_session's address)


def parse_addr(addr: str) -> tuple[str, int]:
    """A tracker's HOST:PORT (an IPv6 host in brackets: [::1]:9190) as (host, port): the one
    parser of tracker addresses; a malformed one is a UsageError naming it."""
    host, _, port = addr.strip().rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError("a tracker address must be HOST:PORT (a port from 1 to 65535)",
                         subject=f"tracker {addr}",
                         hint="e.g. --tracker 192.168.1.10:9190 (the worker host's tracker)")
    return host, int(port)


def phone_address(host: object, port: object) -> str:
    """A phone's identity: the address it registered at its tracker, "host:port"; on a
    loopback address, with this machine's short name ("127.0.0.1:9090@lab3-1f2e"): every
    host has its own 127.0.0.1:9090, and two hosts' phones must never be one phone."""
    addr = f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return f"{addr}@{short_machine()}" if is_loopback(str(host)) else addr


def request_phone(addr: str, key: str, timeout_s: float, priority: int = 1) -> RPCSession:
    """An RPC session on a phone of `key`, handed out by the tracker at `addr`."""
    return request_session(addr, key, timeout_s, priority)[0]


def request_session(addr: str, key: str, timeout_s: float,
                    priority: int = 1) -> tuple[RPCSession, str]:
    """(an RPC session on a phone of `key`, that phone's address "host:port") from the tracker
    at `addr`. TVM's own request (TrackerSession.request) does not say which phone it gave;
    the farm accounts every phone's time by this address (farm/store/phones.py)."""
    from tvm.rpc import client

    url, port, matchkey = grant(addr, key, priority)
    return client.connect(url, port, matchkey, int(timeout_s)), phone_address(url, port)


def grant(addr: str, key: str, priority: int = 1) -> tuple[str, int, str]:
    """Ask the tracker at `addr` for a free phone of `key` (waits for one): its (host, port,
    match key), which a session then connects to (tvm.rpc.client.connect)."""
    from tvm.rpc import base

    host, port = parse_addr(addr)
    last: Exception | None = None
    for _ in range(5):  # as TVM's request: a dropped tracker connection is tried again
        sock = None
        try:
            sock = base.connect_with_retry((host, port), timeout=60)
            sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
            if struct.unpack("<i", base.recvall(sock, 4))[0] != base.RPC_TRACKER_MAGIC:
                raise ServiceError("this is not a TVM RPC tracker", subject=f"tracker {addr}")
            base.sendjson(sock, [base.TrackerCode.REQUEST, key, "", priority])
            value = base.recvjson(sock)
            if value[0] != base.TrackerCode.SUCCESS:
                raise ServiceError(f"the tracker refused a session: {value}",
                                   subject=f"tracker {addr}, key {key}")
            url, phone_port, matchkey = value[1]
            return str(url), int(phone_port), str(matchkey)
        except OSError as e:
            last = e
        finally:
            if sock is not None:
                sock.close()
    raise ServiceError(f"cannot request a phone: {last}", subject=f"tracker {addr}, key {key}")


def phones(addr: str) -> dict[str, KeyInfo]:
    """Device key -> phone counts, read from the tracker at `addr`."""
    from tvm import rpc

    host, port = parse_addr(addr)
    try:
        # TVM's connect_tracker retries for a long time; fail fast when nothing listens.
        socket.create_connection((host, port), timeout=5).close()
        summary = rpc.connect_tracker(host, port).summary()
    except Exception as e:  # noqa: BLE001 - any failure here means: not reachable
        raise ServiceError(f"cannot reach the TVM RPC tracker: {e}", subject=f"tracker {addr}",
                           hint=f"check it with `python -m tvm.exec.query_rpc_tracker "
                                f"--host {host} --port {port}`, or start one with "
                                f"`farm tracker --port {port}`") from e
    totals: dict[str, int] = {}
    hosts: dict[str, set[str]] = {}
    addrs: dict[str, set[str]] = {}
    for server in summary.get("server_info", []):
        key = str(server.get("key", ""))
        if key.startswith("server:"):
            key = key[len("server:"):]
        if key:
            totals[key] = totals.get(key, 0) + 1
            where = server.get("addr") or [None]
            if where[0]:
                hosts.setdefault(key, set()).add(str(where[0]))
                if len(where) > 1:
                    addrs.setdefault(key, set()).add(phone_address(where[0], where[1]))
    out: dict[str, KeyInfo] = {}
    queue = summary.get("queue_info", {})
    for key in set(totals) | set(queue):
        q = queue.get(key, {})
        out[key] = KeyInfo(total=totals.get(key, 0), free=int(q.get("free", 0)),
                           pending=int(q.get("pending", 0)),
                           hosts=tuple(sorted(hosts.get(key, ()))),
                           phones=tuple(sorted(addrs.get(key, ()))))
    return out


def this_host_addresses() -> set[str]:
    """The addresses by which a phone on this machine could have registered."""
    import psutil

    out = {"localhost", socket.gethostname()}
    for addrs in psutil.net_if_addrs().values():
        out.update(a.address.split("%")[0] for a in addrs
                   if a.family in (socket.AF_INET, socket.AF_INET6))
    return out


def wait_for_phones(addr: str, key: str, count: int, timeout_s: float,
                    check: Callable[[], None] | None = None) -> dict[str, KeyInfo]:
    """Block until `count` phones of `key` are registered at the tracker, or raise; `check`
    (raising) is called while waiting (the phones' processes still alive)."""
    deadline = time.monotonic() + timeout_s
    seen: dict[str, KeyInfo] = {}
    while time.monotonic() < deadline:
        if check is not None:
            check()
        try:
            seen = phones(addr)
        except ServiceError:
            seen = {}
        if seen.get(key, KeyInfo(0, 0, 0)).total >= count:
            return seen
        time.sleep(0.3)
    have = seen.get(key, KeyInfo(0, 0, 0)).total
    raise ServiceError(f"only {have} of {count} phones of key {key!r} registered within "
                       f"{timeout_s:.0f} s", subject=f"tracker {addr}",
                       hint="check the phones' logs and the tracker with "
                            "`python -m tvm.exec.query_rpc_tracker`")
