"""The measuring side of a round: TVM's RPCRunner, bounded in time.

TVM's RPCRunner creates its process pool without a timeout, so a frozen phone
(SIGSTOP) hangs tuning forever. This runner gives the pool a timeout of
`run_timeout_s`, and asks the phone to end a slow session itself earlier (70 %
of it). So a kernel that is merely slow is ended by a phone that still answers
(a "timeout" failure of that kernel), while no answer at all by the pool's
deadline means the phone froze or vanished ("device_lost": the candidate is not
stored and is measured again).
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
                                 session_timeout_sec=max(1, int(run_timeout_s * 0.7))),
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
    if "rpcrunner: timeout" in low:
        return "device_lost"  # the pool's deadline: the phone did not answer at all
    if "timeout" in low or "timed out" in low:
        return "timeout"  # the phone answered that the kernel ran too long
    lost = ("connection", "socket", "cannot request", "broken pipe", "connect", "eof",
            "closed", "reset by peer", "tracker")
    if any(s in low for s in lost):
        return "device_lost"
    return "runtime"
