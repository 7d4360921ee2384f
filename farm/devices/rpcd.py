"""TVM's RPC tracker and RPC server, run in this process.

    python -m farm.devices.rpcd tracker --host 127.0.0.1 --port 9190 [--port-end 9191]
    python -m farm.devices.rpcd phone --tracker-host H --tracker-port P --key KEY --host H
                                      --port P [--port-end E] [--custom-addr ADDR]

`python -m tvm.exec.rpc_tracker` and `python -m tvm.exec.rpc_server` import TVM, then start a
PopenWorker (a second Python process) that imports TVM again and runs the server there, so
that a Python caller can kill it. The farm runs each tracker and phone as a process of its
own already (farm/local/services.py stops its process group), so the second process only
cost time: ~2.5 s of CPU per tracker and per phone on a 2-core host, where an embedded farm
starts three of them and a lab host one per phone. Here the same server objects TVM's
PopenWorker runs (`PopenTrackerServerState`, `PopenRPCServerState`: TVM 0.27's internals,
covered by every test that starts a farm) run in this process, and it waits on their thread.
A measurement session is still forked from the phone process by TVM (multiprocessing), as
before. A phone here loads TVM's runtime library only (`runtime_only`), as a real phone's RPC
app does; the emulated arm64 phone is a native server (farm/devices/native/tvm_rpc.cc).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable

from farm.devices.tvmapi import (
    compiler_loaded,
    rpc_server_state,
    tracker_server_state,
    wrap_serving,
)


def serve_tracker(host: str, port: int, port_end: int, silent: bool = True) -> None:
    """A TVM RPC tracker on the first free port of [port, port_end); returns when it stops."""

    state = tracker_server_state(host, port, port_end, silent=silent)
    state.thread.join()


def _survive_crashed_sessions() -> None:
    """A session whose kernel crashes (a segfaulting candidate) kills the forked session
    process, and TVM's `_serving` then raises in the server's only listening thread: the
    phone stopped serving for good, and the embedded farm saw its phone exit and ended the
    job. A real phone's RPC app is restarted by its watchdog; here the crash is logged, the
    session's connection closed and the phone serves the next session. The worker sees the
    session lost (device lost) and measures the candidate elsewhere, or stores it as the
    culprit (workers/metaschedule/callback.py)."""
    import os

    def guard(serving: Callable[..., None]) -> Callable[..., None]:
        def guarded(conn: object, addr: object, opts: object, load_library: object) -> None:
            cwd = os.getcwd()
            try:
                serving(conn, addr, opts, load_library)
            except RuntimeError as e:  # "Child process N exited unsuccessfully with code -11"
                logging.getLogger("RPCServer").warning("session of %s crashed, serving on: %s",
                                                       addr, e)
                os.chdir(cwd)
                conn.close()  # type: ignore[attr-defined]

        return guarded

    wrap_serving(guard)


RUNTIME_ONLY = {"TVM_USE_RUNTIME_LIB": "1"}  # TVM loads libtvm_runtime.so and nothing else


def runtime_only() -> None:
    """This process is a phone: it loads TVM's runtime library only, as a real phone's RPC
    app does (no compiler, no linker: a candidate must come linked). Raises RuntimeError
    when TVM's compiler is already loaded here (too late to be a phone)."""
    import os

    if compiler_loaded():
        raise RuntimeError("TVM's compiler is loaded in this process: it cannot be a phone")
    os.environ.update(RUNTIME_ONLY)


def describe(cpu: str, triple: str) -> None:
    """Register `farm.phone.cpu` (LLVM's name of the CPU and its triple, as the farm that
    started this phone found them): a runtime-only phone cannot ask LLVM itself, and a real
    phone's RPC app does not say (`farm doctor` then says so)."""
    import tvm_ffi

    tvm_ffi.register_global_func("farm.phone.cpu", lambda: f"{cpu} {triple}", override=True)


def serve_phone(host: str, port: int, port_end: int, key: str, tracker: tuple[str, int],
                custom_addr: str | None = None,
                before: Callable[[], None] | None = None) -> None:
    """A TVM RPC server registered at `tracker` under `key` (what `tvm.exec.rpc_server` runs,
    in this process), on TVM's runtime library only; `before` runs first
    (farm/devices/phone.py's slow sessions)."""
    runtime_only()

    if before is not None:
        before()
    _survive_crashed_sessions()
    state = rpc_server_state(host, port, port_end, tracker_addr=tracker, key=key,
                             custom_addr=custom_addr)
    state.thread.join()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m farm.devices.rpcd",
                                description="a TVM RPC tracker or phone, in this process")
    sub = p.add_subparsers(dest="what", required=True)
    t = sub.add_parser("tracker")
    ph = sub.add_parser("phone")
    ph.add_argument("--tracker-host", required=True)
    ph.add_argument("--tracker-port", type=int, required=True)
    ph.add_argument("--key", required=True)
    ph.add_argument("--custom-addr", help="the address registered (default: where it connects "
                                          "from)")
    for q, port in ((t, 9190), (ph, 9090)):
        q.add_argument("--host", default="0.0.0.0")
        q.add_argument("--port", type=int, default=port)
        q.add_argument("--port-end", type=int, default=None, help="default: --port + 1")
    t.add_argument("--verbose", action="store_true", help="log every request")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    port_end = args.port_end or args.port + 1
    if args.what == "tracker":
        serve_tracker(args.host, args.port, port_end, silent=not args.verbose)
    else:
        serve_phone(args.host, args.port, port_end, args.key,
                    (args.tracker_host, args.tracker_port), custom_addr=args.custom_addr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
