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
"""

from __future__ import annotations

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

    def build(self, build_inputs: list[BuilderInput]) -> list[BuilderResult]:
        results: list[BuilderResult] = []
        jobs = [(build_candidate, self.f_export, b.mod, b.target, serialize_params(b.params))
                for b in build_inputs]
        for res in self.pool.map_with_error_catching(lambda x: build_and_export(*x), jobs):
            if res.status == StatusKind.COMPLETE:
                results.append(BuilderResult(res.value, None))
            elif res.status == StatusKind.TIMEOUT:
                results.append(BuilderResult(None, f"build timeout: killed after {self.timeout_s} s"))
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
