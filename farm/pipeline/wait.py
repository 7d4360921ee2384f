"""Stage 5: wait while the workers measure. The client only reads the store: the farm's
supervisor re-sends lost rounds and finalizes the job, client or no client."""

from __future__ import annotations

import time
from collections.abc import Callable

from farm.core.errors import ServiceError, StoreError, TuneError
from farm.core.messages import JobSpec
from farm.pipeline.connect import Farm
from farm.store import StoreUnavailable, TaskState
from farm.store.store import FarmView, StoreHealth

# a live view of a job (the client's): called with the store and the job at every poll
View = Callable[[FarmView, JobSpec], None]


STORE_OUTAGE_S = 180.0  # how long a waiting client tolerates an unreachable store


def wait_for_job(farm: Farm, job: JobSpec, say: Callable[[str], None],
                 timeout_s: float | None, poll_s: float = 0.25,
                 view: View | None = None, full_grace_s: float = 35.0) -> dict[str, TaskState]:
    """Poll the store until every task of the job is done, exhausted or failed. Only waits
    and reads: the farm's supervisor (farm/jobs/supervisor.py) re-sends lost rounds and
    finalizes the job, client or no client. `view`: called at every poll instead of
    reporting a line per change (the client's live view of the tasks). A store that stays
    full for `full_grace_s` (a supervisor sweep and a host TTL: nobody can write the job's
    end into it) ends the wait with StoreError. A view with a `close()` (the client's
    LiveView: the terminal's cursor back) is closed when the wait ends, however it ends."""
    try:
        return _wait(farm, job, say, timeout_s, poll_s, view, full_grace_s)
    finally:
        close = getattr(view, "close", None)
        if close is not None:
            close()


def _wait(farm: Farm, job: JobSpec, say: Callable[[str], None], timeout_s: float | None,
          poll_s: float, view: View | None, full_grace_s: float) -> dict[str, TaskState]:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    last = ""
    outage_since: float | None = None
    full = FullWatch(job, full_grace_s)
    while True:
        farm.check_alive()
        full.check(farm.store)
        try:
            states = farm.store.task_states(job.job_id)
            measured = farm.store.job_measured(job.job_id)
            if view is not None:  # it reads the store too: an outage there is waited out
                view(farm.store, job)
            outage_since = None
        except StoreUnavailable as e:  # Redis restarting: the job goes on, keep waiting
            now = time.monotonic()
            outage_since = outage_since or now
            if now - outage_since > STORE_OUTAGE_S:
                raise ServiceError(f"the store has been unreachable for {STORE_OUTAGE_S:.0f} s: "
                                   f"{e}", subject=f"job {job.job_id}",
                                   hint=f"the job goes on; `farm wait {job.job_id}` later") from e
            say(f"job {job.job_id}: store unreachable ({e}); retrying")
            time.sleep(2)
            continue
        line = progress_line(job, states, measured)
        if view is None and line != last:
            say(line)
            last = line
        if len(states) >= len(job.workload_keys) and all(
                states[wk].terminal for wk in job.workload_keys if wk in states):
            failed = {wk: s for wk, s in states.items() if s.state == "failed"}
            if failed and len(failed) == len(job.workload_keys):
                first = next(iter(failed.values()))
                raise TuneError(f"every task failed; first: {first.message}",
                                subject=f"job {job.job_id}")
            return states
        if deadline is not None and time.monotonic() > deadline:
            raise TuneError(f"not finished after {timeout_s:.0f} s ({line})",
                            subject=f"job {job.job_id}",
                            hint=f"the job goes on; check it with `farm status {job.job_id}`")
        time.sleep(poll_s)


class FullWatch:
    """Asks the store every few seconds whether it is full; raises once it has been for the
    grace: with noeviction no round can record anything, nor any task its end."""

    def __init__(self, job: JobSpec, grace_s: float, every_s: float = 2.0) -> None:
        self.job, self.grace_s, self.every_s = job, grace_s, every_s
        self.asked = 0.0
        self.since: float | None = None

    def check(self, store: StoreHealth) -> None:
        now = time.monotonic()
        if now - self.asked < self.every_s:
            return
        self.asked = now
        try:
            why = store.full()
        except Exception:  # noqa: BLE001 - an unreachable store is the outage's to handle
            return
        if why is None:
            self.since = None
            return
        self.since = self.since or now
        if now - self.since >= self.grace_s:
            raise StoreError(f"the store is full: {why}", subject=f"job {self.job.job_id}",
                             hint="records so far are kept; raise maxmemory "
                                  "(FARM_REDIS_MAXMEMORY or redis.conf), then "
                                  f"`farm resume {self.job.job_id}`")


def progress_line(job: JobSpec, states: dict[str, TaskState], measured: dict[str, int]) -> str:
    counts: dict[str, int] = {}
    for s in states.values():
        counts[s.state] = counts.get(s.state, 0) + 1
    done = sum(counts.get(k, 0) for k in ("done", "exhausted", "failed"))
    parts = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    waiting = [s.message for s in states.values() if s.state == "waiting"]
    extra = f"; {waiting[0]}" if waiting else ""
    return (f"job {job.job_id}: {done}/{len(job.workload_keys)} tasks finished ({parts}), "
            f"{sum(measured.values())} trials measured{extra}")
