"""An emulated phone that is slower per measurement, like a real one.

    python -m farm.phone --tracker HOST:PORT --key KEY --delay-s 0.5 [--host H --port P]

A TVM RPC server (the same as `python -m tvm.exec.rpc_server`) that sleeps
`--delay-s` in every measurement session, when the uploaded kernel is loaded:
a real phone spends that on the upload over USB or Wi-Fi and on the run. The
benchmarks use it to measure how measurement throughput scales with phones
(bench/run.py); `phone_delay_s` in the config turns it on for the embedded farm.
"""

from __future__ import annotations

import argparse
import functools
import time


def _slow_sessions(delay_s: float) -> None:
    """Runs in the server process before it listens: every session it forks (multiprocessing
    fork) calls `_server_env`, which registers `load_module`; ours wraps it in a sleep."""
    import tvm_ffi
    from tvm.rpc import server

    original = server._server_env

    def server_env(load_library: object, work_path: object = None) -> object:
        env = original(load_library, work_path)
        load = tvm_ffi.get_global_func("tvm.rpc.server.load_module")

        @tvm_ffi.register_global_func("tvm.rpc.server.load_module", override=True)
        def load_module(file_name: str) -> object:
            time.sleep(delay_s)
            return load(file_name)

        return env

    server._server_env = server_env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m farm.phone")
    p.add_argument("--tracker", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9090)
    p.add_argument("--port-end", type=int, default=9199)
    p.add_argument("--delay-s", type=float, default=0.0)
    args = p.parse_args(argv)
    from tvm import rpc

    host, port = args.tracker.rsplit(":", 1)
    server = rpc.Server(args.host, args.port, args.port_end, key=args.key,
                        tracker_addr=(host, int(port)),
                        server_init_callback=functools.partial(_slow_sessions, args.delay_s))
    server.proc.join()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
