"""TVM's helper processes, shared by a round process's builds and measurements.

A round builds a batch of candidates (WarmBuilder) and then measures it (BoundedRPCRunner):
never both at once, since MetaSchedule joins a task's measurements before it builds its next
batch. TVM gives each its own PopenPoolExecutor, so a round process kept two sets of
`python -m tvm.exec.popen_worker` processes, each of which imported TVM (~2.5 s of CPU here)
and held its memory: builder_workers for building plus one per phone for measuring.

Here one set of processes serves both: `Processes.view(width, timeout_s)` is an executor
with the part of PopenPoolExecutor's interface the builder and TVM's RPCRunner call
(`submit`, `map_with_error_catching`, `shutdown`), running at most `width` calls at once,
each with its own deadline, on whichever process is idle (a new one only when none is). A
process is recycled after `max_uses` calls (TVM's leak bound); one killed at a deadline
(a frozen phone, a build that hangs) is started again lazily at its next call, as TVM does.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from tvm.support.popen_pool import MapResult, PopenWorker, StatusKind

T = TypeVar("T")
Hook = Callable[[], object] | None  # run before or after a call, outside its deadline


class Processes:
    def __init__(self, initializer: Callable[[], None] | None = None,
                 max_uses: int | None = None) -> None:
        self.initializer = initializer
        self.max_uses = max_uses
        self._idle: list[PopenWorker] = []
        self._all: list[PopenWorker] = []
        self._lock = threading.Lock()

    def _take(self) -> PopenWorker:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            worker = PopenWorker(self.initializer, (), self.max_uses)
            self._all.append(worker)
            return worker

    def _give(self, worker: PopenWorker) -> None:
        with self._lock:
            self._idle.append(worker)

    def call(self, fn: Callable[..., T], args: tuple[object, ...],
             kwargs: dict[str, object] | None, timeout_s: float | None,
             on_cpu: Callable[[float], None] | None = None) -> T:
        """fn(*args, **kwargs) in an idle process; raises TimeoutError after `timeout_s`
        (that process is killed) and what fn raised. `on_cpu` is told the CPU seconds the
        call took in that process (a call killed at its deadline tells nothing)."""
        worker = self._take()
        try:
            worker.send(timed_call, (fn, args, kwargs), None, timeout_s)
            ok, value, cpu_s = worker.recv()
        finally:
            self._give(worker)
        if on_cpu is not None:
            on_cpu(cpu_s)
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]

    @property
    def started(self) -> int:
        """Processes made so far (each started when first needed)."""
        return len(self._all)

    def view(self, width: int, timeout_s: float | None) -> Executor:
        return Executor(self, width, timeout_s)

    def shutdown(self) -> None:
        with self._lock:
            for worker in self._all:
                worker.kill()
            self._all, self._idle = [], []


def cpu_now() -> float:
    """CPU seconds of this process so far: its threads' and its ended children's (a build's
    linker)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


_REPORTED = [0.0]  # in a helper process: its CPU seconds told so far


def timed_call(fn: Callable[..., object], args: tuple[object, ...],
               kwargs: dict[str, object] | None) -> tuple[bool, object, float]:
    """fn(*args, **kwargs) in a helper process: (returned, its value or what it raised, the
    CPU seconds this process took since its last call was told: the call's own, and for its
    first call the process's start, TVM's imports included)."""
    try:
        ok, value = True, fn(*args, **(kwargs or {}))
    except Exception as e:  # noqa: BLE001 - raised again in the caller's process
        ok, value = False, e
    now = cpu_now()
    spent, _REPORTED[0] = now - _REPORTED[0], now
    return ok, value, spent


def warm_build_process() -> None:
    """Initializer of each build process: pay TVM's imports once, not per build."""
    from tvm.driver import build  # noqa: F401
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock  # noqa: F401


def for_rounds(max_uses: int) -> Processes:
    """The processes of a round process (workers/round/measure.py): warm for building, recycled
    after `max_uses` calls."""
    return Processes(warm_build_process, max_uses)


class Executor:
    """At most `width` calls at once on `processes`, each bounded by `timeout_s`. `before` and
    `after` (as they were when the call was submitted) run around the call, outside its
    deadline: the runner's turn for its batch (workers/metaschedule/turns.py) waits in `before`, and
    `after` says the call is over, however it ended."""

    def __init__(self, processes: Processes, width: int, timeout_s: float | None) -> None:
        self.processes = processes
        self.timeout_s = timeout_s
        self.before: Hook = None
        self.after: Hook = None
        self._threads = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, width))
        self._cpu_s = 0.0
        self._cpu_lock = threading.Lock()

    @property
    def cpu_s(self) -> float:
        """CPU seconds this view's calls took in their processes, so far."""
        return self._cpu_s

    def _add_cpu(self, s: float) -> None:
        with self._cpu_lock:
            self._cpu_s += s

    def _call(self, hooks: tuple[Hook, Hook], fn: Callable[..., T], args: tuple[object, ...],
              kwargs: dict[str, object] | None) -> T:
        before, after = hooks
        try:
            if before is not None:
                before()
            return self.processes.call(fn, args, kwargs, self.timeout_s, self._add_cpu)
        finally:
            if after is not None:
                after()

    def _caught(self, hooks: tuple[Hook, Hook], fn: Callable[..., object],
                arg: object) -> MapResult:
        try:
            return MapResult(status=StatusKind.COMPLETE, value=self._call(hooks, fn, (arg,), None))
        except TimeoutError as e:
            return MapResult(status=StatusKind.TIMEOUT, value=e)
        except Exception as e:  # noqa: BLE001 - returned to the caller, as TVM's pool does
            return MapResult(status=StatusKind.EXCEPTION, value=e)

    def submit(self, fn: Callable[..., T], *args: object,
               **kwargs: object) -> concurrent.futures.Future[T]:
        hooks = (self.before, self.after)  # as they are now
        return self._threads.submit(self._call, hooks, fn, args, kwargs)

    def map_with_error_catching(self, fn: Callable[..., object],
                                items: Iterable[object]) -> Iterator[MapResult]:
        hooks = (self.before, self.after)
        return self._threads.map(lambda x: self._caught(hooks, fn, x), items)

    def shutdown(self, wait: bool = True) -> None:
        """Ends this view's threads; the processes belong to `processes`."""
        self._threads.shutdown(wait=wait)
