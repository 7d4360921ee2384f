"""An emulated phone: a TVM RPC server, optionally slower per measurement, like a real one.

    python -m farm.devices.phone --tracker HOST:PORT --key KEY --delay-s 0.5 [--host H --port P]
                         [--advertise ADDR]

A TVM RPC server (the same as `python -m tvm.exec.rpc_server`, in one process:
farm/devices/rpcd.py); every emulated phone of this machine's architecture is one. With
`--delay-s` it sleeps that long in every measurement session, when the uploaded kernel is
loaded: a real phone spends that on the upload over USB or Wi-Fi and on the run. The
benchmarks use it to measure how measurement throughput scales with phones
(bench/run.py); `phone_delay_s` in the config turns it on for the embedded farm.

With `--heat-after-s T` it heats T seconds after its first session, as a phone whose governor lowers
its clocks: from then on its sessions run an eighth of the time (stopped and continued in
turn), so its kernels run ~8x slower (`phone_heat_after_s` turns it on for the embedded farm's
first phone: tests of the farm's heat checks; a slowdown well beyond what a loaded test
machine does to a phone on its cores).

Where a phone is reached: it listens on `--host` and gives the tracker the address a worker
should connect to (`advertised_address`); the tracker hands that address to every session.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable

from farm.core.errors import UsageError
from farm.core.hostid import is_loopback
from farm.devices.rpcd import describe, serve_phone
from farm.devices.tracker import parse_addr, this_host_addresses
from farm.devices.tvmapi import wrap_server_env, wrap_serving

WILDCARDS = ("0.0.0.0", "::", "")


def advertised_address(host: str, advertise: str | None, tracker: str) -> str | None:
    """The address a phone listening on `host` registers at `tracker`, for workers to connect to.

    `advertise` when given, else `host` unless it is a wildcard; None lets the tracker record
    the address the phone connected from. Raises UsageError for an address no worker could
    use: a phone bound to loopback that advertises another address, or one that advertises
    loopback to a tracker on another machine (its worker would connect to its own loopback).
    """
    addr = advertise or (None if host in WILDCARDS else host)
    if addr is None:
        return None
    if is_loopback(host) and not is_loopback(addr):
        raise UsageError(f"the phones listen on {host} only, so nothing answers at {addr}",
                         subject=f"phones advertising {addr}",
                         hint="bind an address the workers reach: --host 0.0.0.0 "
                              f"--advertise {addr}")
    tracker_host = parse_addr(tracker)[0]
    if is_loopback(addr) and not _on_this_machine(tracker_host):
        raise UsageError(f"the phones would advertise {addr} to tracker {tracker}, which is on "
                         "another machine: its worker would connect to its own loopback",
                         subject=f"phones of tracker {tracker}",
                         hint="run them with --host 0.0.0.0 --advertise <an address of this "
                              "machine that the worker host reaches>")
    return addr


def _on_this_machine(host: str) -> bool:
    if is_loopback(host):
        return True

    try:
        resolved = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return True  # unknown here: registering will fail and say so
    return bool(resolved & this_host_addresses())


def _slow_sessions(delay_s: float) -> None:
    """Runs in the server process before it listens: every session it forks (multiprocessing
    fork) calls `_server_env`, which registers `load_module`; ours wraps it in a sleep."""
    import tvm_ffi

    def slowed(original: Callable[..., object]) -> Callable[..., object]:
        def server_env(load_library: object, work_path: object = None) -> object:
            env = original(load_library, work_path)
            load = tvm_ffi.get_global_func("tvm.rpc.server.load_module")

            @tvm_ffi.register_global_func("tvm.rpc.server.load_module", override=True)
            def load_module(file_name: str) -> object:
                time.sleep(delay_s)
                return load(file_name)

            return env

        return server_env

    wrap_server_env(slowed)


def slow_flags(delay_s: float, heat_after_s: float) -> list[str]:
    """This module's flags for a phone `delay_s` slower a session that heats `heat_after_s`
    after its first (0: neither)."""
    return [*(["--delay-s", str(delay_s)] if delay_s > 0 else []),
            *(["--heat-after-s", str(heat_after_s)] if heat_after_s > 0 else [])]


HEAT_ON_S, HEAT_OFF_S = 0.001, 0.007  # a heated phone's sessions run 1 ms in every 8


def _heat_after(after_s: float) -> None:
    """`after_s` after the phone's first session, its sessions run an eighth of the time:
    stopped and continued in turn (SIGSTOP, SIGCONT), as a governor's lower clock slows a
    phone, at no CPU cost to the machine (busy processes beside it slowed every other process
    of a small test machine too). Each session dies with the phone (PR_SET_PDEATHSIG): one
    stopped when the phone is killed does not stay behind."""
    working = threading.Event()

    def noted(serving: Callable[..., None]) -> Callable[..., None]:
        def serve(*args: object) -> None:
            working.set()
            serving(*args)

        return serve

    def dies_with_phone(original: Callable[..., object]) -> Callable[..., object]:
        def server_env(*args: object, **kwargs: object) -> object:
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG, in the session
            return original(*args, **kwargs)

        return server_env

    wrap_serving(noted)
    wrap_server_env(dies_with_phone)

    def throttle() -> None:
        working.wait()
        time.sleep(after_s)
        logging.getLogger("phone").warning("heating: its sessions run %.0f %% of the time from "
                                           "now on", 100 * HEAT_ON_S / (HEAT_ON_S + HEAT_OFF_S))
        while True:
            sessions = _children()
            _signal(sessions, signal.SIGSTOP)
            time.sleep(HEAT_OFF_S)
            _signal(sessions, signal.SIGCONT)
            time.sleep(HEAT_ON_S)

    threading.Thread(target=throttle, daemon=True, name="heat").start()


def _children() -> list[int]:
    """This process's children (its sessions), from each thread's /proc children list."""
    out: list[int] = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children", encoding="ascii") as f:
                out.extend(int(pid) for pid in f.read().split())
        except OSError:  # the thread ended meanwhile
            continue
    return out


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:  # the session ended meanwhile
            continue


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m farm.devices.phone")
    p.add_argument("--tracker", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9090)
    p.add_argument("--port-end", type=int, default=9199)
    p.add_argument("--delay-s", type=float, default=0.0)
    p.add_argument("--heat-after-s", type=float, default=0.0,
                   help="heat this long after the first session: ~8x slower from then on "
                        "(tests)")
    p.add_argument("--advertise", help="the address workers connect to (default --host)")
    p.add_argument("--cpu", default="", help="LLVM's name of this CPU, for `farm doctor`")
    p.add_argument("--triple", default="", help="this machine's target triple, for `farm doctor`")
    p.add_argument("--opencl", metavar="LIB", help="TVM's OpenCL runtime (a sidecar library, "
                                                   "farm/devices/opencl.py) to load")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO)  # sessions are logged, as tvm.exec.rpc_server does

    def before() -> None:  # runs once the phone is runtime-only
        if args.cpu or args.triple:
            describe(args.cpu, args.triple)
        if args.delay_s > 0:
            _slow_sessions(args.delay_s)
        if args.heat_after_s > 0:
            _heat_after(args.heat_after_s)
        if args.opencl:  # registers the opencl device; OpenCL starts in each session, not here
            import tvm  # noqa: F401 - loads libtvm_runtime.so, which the sidecar links to

            ctypes.CDLL(args.opencl, ctypes.RTLD_LOCAL)

    serve_phone(args.host, args.port, args.port_end, args.key, parse_addr(args.tracker),
                custom_addr=advertised_address(args.host, args.advertise, args.tracker),
                before=before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
