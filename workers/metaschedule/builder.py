"""A MetaSchedule builder whose build processes stay warm for the worker's whole life.

TVM's LocalBuilder starts a fresh process pool on every `build` call (each new
process imports TVM again: ~20 s per call on 2 cores, whether it builds 1
candidate or 16). This builder keeps its processes (shared with the round's runner:
workers/metaschedule/procs.py) and recycles each after `max_uses` calls, which bounds the
memory leak that made LocalBuilder start fresh pools.

Its processes also skip what LocalBuilder's default build imports first: every
tensor intrinsic TVM ships (`tvm.s_tir.tensor_intrin`, ~30 s of TVMScript parsing
per process on this machine, 3 s for the rest of TVM). Building does not need
the registry: a tensorized block was already rewritten into the intrinsic's body
when the worker process (which does hold the registry) applied the schedule.

A build is bounded by what this builder's builds take, not only by `build_timeout_s`: a
random schedule with deep explicit unrolling can keep LLVM's code generator busy 20-60 s
(seen in the tests: 42 s in `write_to_file` for one candidate, twice), holding a build
process while the phones wait for the batch. Once it has built `BOUND_AFTER` candidates, a
build may take `BOUND_FACTOR` times the 90th percentile of its recent builds' CPU seconds (at
least `BOUND_FLOOR_S`, at most the setting); one killed at that bound is a build failure as
a timed-out build always was.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult, PyBuilder
from tvm.support.popen_pool import StatusKind

from farm.core.aliases import IRModule, RuntimeModule, Target
from farm.devices.tvmapi import build_and_export, serialize_params
from workers.metaschedule.procs import Processes, warm_build_process


def build_candidate(mod: IRModule, target: Target, _params: object) -> RuntimeModule:
    """MetaSchedule's `default_build` without its `import tvm.s_tir.tensor_intrin`."""
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm_build(mod, target=target)


BOUND_AFTER = 16  # builds seen before they bound the next ones
BOUND_FACTOR = 10.0  # ... at this many times their 90th percentile (a loaded host: 2-3x)
BOUND_FLOOR_S = 10.0  # ... and never under this
RECENT_BUILDS = 64


class BuildBound:
    """How long this builder's next build may take (see the module's docstring)."""

    def __init__(self, ceiling_s: float) -> None:
        self.ceiling_s = ceiling_s
        self._recent: deque[float] = deque(maxlen=RECENT_BUILDS)
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        with self._lock:
            self._recent.append(seconds)

    def seconds(self) -> float:
        with self._lock:
            recent = sorted(self._recent)
        if len(recent) < BOUND_AFTER:
            return self.ceiling_s
        p90 = recent[int(0.9 * (len(recent) - 1))]
        return min(self.ceiling_s, max(BOUND_FLOOR_S, BOUND_FACTOR * p90))


def build_timed(job: tuple[object, ...]) -> tuple[str, float]:
    """In a build process: build and export one candidate; its path and the CPU seconds it
    took there."""
    t0 = time.process_time()
    path = build_and_export(*job)  # type: ignore[arg-type]
    return path, time.process_time() - t0


@derived_object
class WarmBuilder(PyBuilder):
    def __init__(self, max_workers: int = 1, timeout_s: float = 60.0, max_uses: int = 64,
                 f_export: Callable[[RuntimeModule], str] | None = None,
                 processes: Processes | None = None) -> None:
        """Builds `max_workers` candidates at once, on `processes` (shared with the round's
        runner: workers/metaschedule/procs.py) or on processes of its own."""
        super().__init__()
        self.max_workers = max_workers
        self.timeout_s = timeout_s
        self.max_uses = max_uses
        self.f_export = f_export
        self.own = processes is None
        self.processes = processes or Processes(warm_build_process, max_uses)
        self.pool = self.processes.view(max_workers, timeout_s)
        self.bound = BuildBound(timeout_s)

    def build(self, build_inputs: list[BuilderInput]) -> list[BuilderResult]:
        results: list[BuilderResult] = []
        jobs = [(build_candidate, self.f_export, b.mod, b.target, serialize_params(b.params))
                for b in build_inputs]
        bound = self.pool.timeout_s = self.bound.seconds()  # this batch's
        for res in self.pool.map_with_error_catching(build_timed, jobs):
            if res.status == StatusKind.COMPLETE:
                path, seconds = res.value
                self.bound.add(seconds)
                results.append(BuilderResult(path, None))
            elif res.status == StatusKind.TIMEOUT:
                results.append(BuilderResult(None, f"build timeout: killed after {bound:.0f} s"
                                             + (f" (its builds' bound; the setting's: "
                                                f"{self.timeout_s:.0f} s)"
                                                if bound < self.timeout_s else "")))
            else:
                results.append(BuilderResult(None, f"build error: {res.value}"))
        return results

    def warm(self) -> None:
        """Start the build processes now (each imports TVM once), not at the first build."""
        futures = [self.pool.submit(warm_build_process) for _ in range(self.max_workers)]
        for f in futures:
            f.result()

    def shutdown(self) -> None:
        self.pool.shutdown()
        if self.own:
            self.processes.shutdown()
