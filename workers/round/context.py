"""What a worker process keeps warm for its whole life, built once and used by every round:
its builders and runners (one per profile), TVM's helper processes, the broker's queues,
the gate's view of how many rounds run at once."""

from __future__ import annotations

import functools
import logging
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from farm.core.aliases import CeleryApp, IRModule
from farm.core.config import FarmConfig
from farm.core.cores import usable_cores
from farm.core.profiles import DeviceProfile, resolve_profile
from farm.devices import intrinsics
from farm.devices.cross import export_shared, linker
from farm.store import open_broker

if TYPE_CHECKING:  # the warm parts import TVM: each is imported when first made
    from farm.store.broker import BrokerQueues
    from workers.metaschedule.builder import WarmBuilder
    from workers.metaschedule.procs import Processes
    from workers.metaschedule.runner import BoundedRPCRunner
    from workers.round.gate import Gate

log = logging.getLogger(__name__)


@dataclass
class WorkerContext:
    """What a worker process keeps warm for its whole life (built once, reused every round)."""

    config: FarmConfig
    tracker: str
    host: str = field(default_factory=socket.gethostname)
    _builders: dict[str, WarmBuilder] = field(default_factory=dict)
    _runners: dict[tuple[str, int], BoundedRPCRunner] = field(default_factory=dict)
    _processes: Processes | None = None  # workers/metaschedule/procs.py
    _broker: BrokerQueues | None = None  # the broker's queues, made on first use
    gate: Gate | None = None  # workers/round/gate.py: rounds at once follow the measured speeds
    rounds_at_once: int = 0  # what the gate decided last (logged when it changes)
    app: CeleryApp | None = None  # the worker's Celery app: a round lends its search with it

    def search_threads(self, profile: DeviceProfile) -> int:
        """Phones of their own: the cores / the keys served (a key's batches go to the phones
        one after another: while one round searches, the other's is on the phones). Phones
        on this host's CPU: the cores / the rounds at once (cores left to measure on)."""
        if self.gate is None or self.config.search_cores > 0:
            return self.config.search_threads
        if profile.host_cpu:
            return max(1, usable_cores() // max(1, self.rounds_at_once))
        # pool: 2 per key, and the room for rounds lent to helpers (searched there)
        return max(1, usable_cores() * 2 // max(2, self.gate.pool - self.gate.lend_room))

    def broker(self) -> BrokerQueues:
        """The broker's queues, read (farm/store/broker.py): one client for this process."""
        self._broker = self._broker or open_broker(str(self.config.broker_url))
        return self._broker

    def profile(self, key: str) -> DeviceProfile:
        return resolve_profile(key, self.config.profiles)

    def processes(self) -> Processes:
        """TVM's helper processes, shared by this process's builders and runners."""
        # here: TVM's parts load TVM when first made
        from workers.metaschedule.procs import for_rounds

        self._processes = self._processes or for_rounds(self.config.builder_max_uses)
        return self._processes

    def builder(self, profile: DeviceProfile) -> WarmBuilder:
        """The warm builder of the profile's linker: candidates are shared libraries linked
        here (a phone holds TVM's runtime only), by this machine's compiler (`local`) or by
        the profile's (`cross`, e.g. the NDK's)."""
        # here: TVM's parts load TVM when first made
        from workers.metaschedule.builder import WarmBuilder

        cc = linker(profile)
        slot = f"{profile.export}:{cc or ''}"
        if slot not in self._builders:
            self._builders[slot] = WarmBuilder(
                max_workers=self.config.builder_workers, timeout_s=self.config.build_timeout_s,
                max_uses=self.config.builder_max_uses,
                f_export=functools.partial(export_shared, cc), processes=self.processes())
        return self._builders[slot]

    def runner(self, profile: DeviceProfile, phones: int) -> BoundedRPCRunner:
        slot = (profile.key, max(1, phones))
        if slot not in self._runners:
            # here: TVM's parts load TVM when first made (the heartbeat's context never does)
            from workers.metaschedule.phonelog import LostPolicy
            from workers.metaschedule.runner import BoundedRPCRunner

            c = self.config
            self._runners[slot] = BoundedRPCRunner(
                self.tracker, profile, max_workers=slot[1], run_timeout_s=c.run_timeout_s,
                policy=LostPolicy(c.phone_lost_limit, c.phone_lost_window_s, c.phone_aside_s),
                processes=self.processes())
        return self._runners[slot]

    def warm(self) -> None:
        """Pay TVM's one-off costs now (tensor intrinsics, the first TuneContext: ~15 s)."""
        import tvm
        from tvm.s_tir import meta_schedule as ms

        t0 = time.monotonic()
        preload()

        target = tvm.target.Target({"kind": "llvm", "num-cores": 1})
        mod = _tiny_workload()
        ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply",
                             search_strategy="evolutionary", task_name="warm-up")
        ctx.generate_design_space()
        self.builder(self.profile(self.config.device_key)).warm()
        log.info("worker %s: warm in %.1f s", self.host, time.monotonic() - t0)


def preload() -> None:
    """Import what every round needs: TVM, MetaSchedule and the CPU tensor intrinsics
    (farm/devices/intrinsics.py: a few seconds, not the 30-40 s of TVM's whole registry).
    `farm worker` calls it once in its main process before the pool forks, so a pool child
    that replaces a killed one (a Redis outage cancels the running rounds; a poison round
    kills its child) starts warm. Imports only: no TVM thread pool exists before the fork."""
    from tvm.s_tir import meta_schedule  # noqa: F401
    from tvm.script import tirx  # noqa: F401

    intrinsics.load_for("llvm")


def _tiny_workload() -> IRModule:
    from tvm import te

    a = te.placeholder((8, 8), name="A")
    b = te.placeholder((8, 8), name="B")
    k = te.reduce_axis((0, 8), name="k")
    c = te.compute((8, 8), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    import tvm

    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})
