"""The measuring side of a round: TVM's RPCRunner, bounded in time.

TVM's RPCRunner creates its process pool without a timeout, so a frozen phone
(SIGSTOP) hangs tuning forever. This runner gives the pool a timeout of
`run_timeout_s`, and asks the phone to end a slow session itself earlier (70 %
of it). So a kernel that is merely slow is ended by a phone that still answers
(a "timeout" failure of that kernel), while no answer at all by the pool's
deadline means the phone froze or vanished ("device_lost": the candidate is not
stored and is measured again).

It also checks every candidate's output (profiles with `check_outputs`): before
timing, the candidate and the workload's unscheduled kernel (the reference,
built once per round with the same linker) run on the same inputs on the phone;
a candidate whose output differs is a `wrong_answer`, stored as failed, never best.
What runs on the phone needs TVM's runtime only: farm/devices/evaluate.py.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import logging
import os
import tempfile
import time
from typing import TYPE_CHECKING

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, RPCConfig

from farm.core.profiles import DeviceProfile
from farm.devices.evaluate import WRONG, alloc_on_phone, checked_run_evaluator, session_threads
from farm.devices.thermometer import Thermometer, thermometer
from farm.devices.tracker import parse_addr
from farm.devices.tvmapi import rpc_runner_class
from workers.metaschedule import phonelog
from workers.metaschedule.phonelog import LostPolicy, PhoneLog
from workers.metaschedule.procs import Executor, Processes
from workers.metaschedule.turns import Turns

if TYPE_CHECKING:
    from tvm.s_tir.meta_schedule.runner import RunnerFuture, RunnerInput

log = logging.getLogger(__name__)


@derived_object
class BoundedRPCRunner(rpc_runner_class()):  # type: ignore[misc]
    def __init__(self, tracker: str, profile: DeviceProfile, max_workers: int,
                 run_timeout_s: float, processes: Processes,
                 policy: LostPolicy | None = None) -> None:
        host, port = parse_addr(tracker)
        super().__init__(
            rpc_config=RPCConfig(tracker_host=host, tracker_port=port, tracker_key=profile.key,
                                 session_priority=1,
                                 session_timeout_sec=max(1, int(run_timeout_s * 0.7))),
            evaluator_config=EvaluatorConfig(number=profile.number, repeat=profile.repeat,
                                             min_repeat_ms=profile.min_repeat_ms,
                                             enable_cpu_cache_flush=profile.cache_flush),
            cooldown_sec=profile.cooldown_s,
            max_workers=max_workers,
        )
        self.pool.shutdown()  # measures on `processes` (the builder's too: workers/metaschedule/procs.py)
        # older batches of the key on this host first (workers/metaschedule/turns.py)
        self.turns = Turns(tracker, profile.key, stale_s=2 * run_timeout_s + 10)
        self.pool: Executor = processes.view(max_workers, run_timeout_s)
        fd, path = tempfile.mkstemp(prefix="farm-phones-", suffix=".jsonl")
        os.close(fd)
        atexit.register(_remove, path)
        atexit.register(_remove, path + ".aside")
        policy = dataclasses.replace(policy or LostPolicy(), heat_share=profile.heat_share,
                                     heat_rest_s=profile.heat_rest_s)
        self.phone_log = PhoneLog(path, deadline_s=run_timeout_s, tracker=tracker,
                                  key=profile.key, policy=policy)  # which phone measured what
        self._create_session = functools.partial(phonelog.create_session, path, tracker,
                                                 profile.cooldown_s, threads=session_threads(profile),
                                                 heat=_thermometer(profile))
        self.f_create_session = self._create_session
        self.f_upload_module = functools.partial(phonelog.upload_module, path)
        self.f_cleanup = functools.partial(phonelog.cleanup, path)
        self.f_alloc_argument = alloc_on_phone  # filled on the host: farm/devices/evaluate.py
        self.reference: str | None = None
        self.started = 0.0  # monotonic time the last batch went to the phones
        self.ended = 0.0  # ... and its last measurement returned

    def _sanity_check(self) -> None:
        """TVM's RPCRunner starts a process at construction (~2.5 s of CPU importing TVM) to
        look up its `f_*` functions by name; this runner passes none by name (they are set
        as Python callables above), so there is nothing to look up."""

    def set_reference(self, path: str | None) -> None:
        """The reference kernel of the workload being tuned (None: no output check)."""
        self.reference = path

    def run(self, runner_inputs: list[RunnerInput]) -> list[RunnerFuture]:
        self.f_run_evaluator = (functools.partial(checked_run_evaluator, self.reference)
                                if self.reference else None)
        self.started = time.monotonic()
        ticket = self.turns.start(len(runner_inputs))
        # bound to this batch: its calls wait for older batches, count once granted a phone
        # (in the process that asks) and, all returned, let the younger ones go
        self.pool.before = functools.partial(self.turns.wait, ticket)
        self.pool.after = functools.partial(self._returned, ticket)
        self.f_create_session = functools.partial(self._create_session, ticket=ticket)
        config: RPCConfig = self.rpc_config  # type: ignore[has-type]
        self.rpc_config = config._replace(session_priority=self.turns.priority)
        return super().run(runner_inputs)

    def _returned(self, ticket: str) -> None:
        self.ended = time.monotonic()
        self.turns.returned(ticket)


def _thermometer(profile: DeviceProfile) -> Thermometer | None:
    """The profile's thermometer (None: heat checks off, or it does not build: said so)."""
    try:
        return thermometer(profile)
    except Exception as e:  # noqa: BLE001 - tune without heat checks rather than not at all
        log.warning("key %s: no thermometer (heat checks off): %s", profile.key, e)
        return None


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def classify_run_error(msg: str) -> str:
    """A runner error message -> failure class (device_lost is retried, never stored)."""
    low = msg.lower()
    if WRONG in low:
        return "wrong_answer"  # the candidate ran and computed something else
    if "rpcrunner: timeout" in low:
        return "device_lost"  # the pool's deadline: the phone did not answer at all
    if "timeout" in low or "timed out" in low:
        return "timeout"  # the phone answered that the kernel ran too long
    lost = ("connection", "socket", "cannot request", "broken pipe", "connect", "eof",
            "closed", "reset by peer", "tracker")
    if any(s in low for s in lost):
        return "device_lost"
    return "runtime"
