"""The measuring side of a round: TVM's RPCRunner, bounded in time.

TVM's RPCRunner creates its process pool without a timeout, so a frozen phone
(SIGSTOP) hangs tuning forever. This runner gives the pool a timeout; a
measurement that exceeds it is killed and reported, never waited on.
"""

from __future__ import annotations

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, RPCConfig, RPCRunner
from tvm.support.popen_pool import PopenPoolExecutor

from farm.profiles import DeviceProfile
from farm.tracker import parse_addr


@derived_object
class BoundedRPCRunner(RPCRunner._cls):  # type: ignore[name-defined,misc]
    def __init__(self, tracker: str, profile: DeviceProfile, max_workers: int,
                 run_timeout_s: float) -> None:
        host, port = parse_addr(tracker)
        super().__init__(
            rpc_config=RPCConfig(tracker_host=host, tracker_port=port, tracker_key=profile.key,
                                 session_priority=1,
                                 session_timeout_sec=max(1, int(run_timeout_s))),
            evaluator_config=EvaluatorConfig(number=profile.number, repeat=profile.repeat,
                                             min_repeat_ms=profile.min_repeat_ms),
            cooldown_sec=profile.cooldown_s,
            max_workers=max_workers,
        )
        self.pool.shutdown()
        self.pool = PopenPoolExecutor(max_workers=max_workers, timeout=run_timeout_s)


def classify_run_error(msg: str) -> str:
    """A runner error message -> failure class (device_lost is retried, never stored)."""
    low = msg.lower()
    lost = ("connection", "socket", "cannot request", "broken pipe", "rpc session",
            "connect", "eof", "closed", "reset by peer", "tracker")
    if "timeout" in low and ("killed after" in low or "timed out" in low):
        return "timeout"
    if any(s in low for s in lost):
        return "device_lost"
    return "runtime"
