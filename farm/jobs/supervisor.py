"""The farm's supervisor: jobs finish with no client attached, and a lost round costs seconds.

Every `farm worker` (so every embedded farm too) runs one as a thread of its main
process; one at a time leads (a leader lock in the store, renewed every sweep, so a
dead leader is replaced within `3 x interval_s`). Every `interval_s` the leader sweeps
the active jobs:

- a job whose tasks have all ended is finalized (once: `finalize_once`);
- a task whose outstanding round (`TaskState.round`) has no live copy is sent again, as a
  new attempt of the same round, when its state has not moved for `grace_s`. Live means:
  a copy holds the round's lease (farm/jobs/fence.py; a dead process's lease expires after
  one host TTL, and one of this machine is seen dead at once) or its message waits in the
  broker's queue. A message parked in Celery's
  `unacked` hash by a dead worker or a Redis crash is not live: it would come back only
  after the visibility timeout, and when it does, the fence skips it;
- a budgeted job with budget left and no round in flight gets its next rounds planned.

Sends are idempotent by the fence, so a false alarm costs a skipped copy, never a
measurement made twice. Thread safety: one instance per worker process.
"""

from __future__ import annotations

import logging
import threading
import time

from farm.core.aliases import CeleryApp
from farm.core.messages import JobSpec, RoundRequest
from farm.jobs import finalize as finalize_stage
from farm.jobs.advance import plan_next_round
from farm.jobs.dispatch import queued_round_ids, send_round
from farm.jobs.fence import holder_is_dead
from farm.store import TaskState
from farm.store.broker import BrokerQueues
from farm.store.cold import drain
from farm.store.retention import prune
from farm.store.store import RecordsAndJobs

log = logging.getLogger(__name__)


class Supervisor(threading.Thread):
    def __init__(self, app: CeleryApp, store: RecordsAndJobs, broker: BrokerQueues, node: str,
                 interval_s: float, grace_s: float) -> None:
        super().__init__(name=f"supervisor-{node}", daemon=True)
        self.app = app
        self.store = store
        self.broker = broker  # the broker's queue lists (read)
        self.node = node
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.stopping = threading.Event()
        self.leading = False
        self.retention_days = 0.0  # archive days kept (0: always); the worker sets its config's
        self.pruned_at = 0.0

    def run(self) -> None:
        while not self.stopping.wait(self.interval_s):
            try:
                leading = self.store.lead(self.node, ttl_s=3 * self.interval_s)
                if leading != self.leading:
                    log.info("supervisor %s: %s", self.node,
                             "leads the farm" if leading else "no longer leads")
                    self.leading = leading
                if leading:
                    self.sweep()
                    self.keep_archive()
            except Exception as e:  # noqa: BLE001 - the store restarting: try next sweep
                log.warning("supervisor %s: sweep failed (will retry): %s", self.node, e)

    def keep_archive(self, now: float | None = None) -> int:
        """The leader moves the store's spool into the archive (records that left Redis),
        and once an hour deletes archive days past the retention. Returns records moved."""

        archive = self.store.archive
        if archive is None:
            return 0
        moved = drain(self.store, archive, owner=self.node)
        now = time.time() if now is None else now
        if self.retention_days > 0 and now - self.pruned_at >= 3600:
            self.pruned_at = now
            for folder in prune(self.store, archive, self.retention_days, now):
                log.info("supervisor %s: archive %s deleted (older than %g days)", self.node,
                         folder, self.retention_days)
        return moved

    def stop(self) -> None:
        self.stopping.set()

    def sweep(self) -> list[str]:
        """One pass over the active jobs. Returns the round ids sent again."""
        queued: dict[str, set[str]] = {}
        sent: list[str] = []
        for job_id in self.store.active_jobs():
            job = self.store.get_job(job_id)
            status = self.store.job_status(job_id).get("state", "")
            if job is None or status in ("cancelled", "finalized", "failed"):
                self.store.set_active(job_id, False)
                continue
            if finalize_stage.job_finished(self.store, job):
                finalize_stage.finalize_job(self.store, job, by=f"supervisor {self.node}")
                self.store.set_active(job_id, False)
                continue
            if job.device_key not in queued:
                queued[job.device_key] = queued_round_ids(self.broker, job.device_key)
            states = self.store.task_states(job_id)
            for wk, st, req in self._lost_rounds(states, queued[job.device_key]):
                sent.append(self._send_again(job, wk, st, req))
            if job.trials_budget and not any(s.outstanding for s in states.values()):
                plan_next_round(self.app, self.store, job)
        return sent

    def _lost_rounds(self, states: dict[str, TaskState],
                     queued: set[str]) -> list[tuple[str, TaskState, RoundRequest]]:
        """The tasks' outstanding rounds of which no copy is live (their leases read in one
        round trip)."""
        now = time.time()
        # moved lately: in transit, starting, or a retry counting down
        due = [(wk, st, RoundRequest.from_json(st.round)) for wk, st in states.items()
               if st.outstanding and st.round and now - st.updated_at >= self.grace_s]
        holders = self.store.round_holders([req.logical_id for _, _, req in due])
        return [(wk, st, req) for (wk, st, req), holder in zip(due, holders, strict=True)
                # a copy runs (its lease is renewed while its process lives), or it waits
                # in the broker behind other rounds
                if (holder is None or holder_is_dead(holder)) and req.logical_id not in queued]

    def _send_again(self, job: JobSpec, wk: str, st: TaskState, req: RoundRequest) -> str:
        again = req.again()
        idle = time.time() - st.updated_at
        log.warning("supervisor %s: job %s: round %d of %s has no live copy (state %s, idle "
                    "%.0f s); sending it again as attempt %d", self.node, job.job_id,
                    req.round_index + 1, req.task_name, st.state, idle, again.attempt)
        self.store.set_task_state(job.job_id, wk, TaskState.from_json({
            **st.to_json(), "state": "queued", "round": again.to_json(), "updated_at": time.time(),
            "message": f"round {req.round_index + 1} sent again: no live copy for {idle:.0f} s"}))
        if st.state != "tuning":  # it never began (a lost message): a retry of its own; one
            # that began counts when its new copy begins (workers/round/measure.py `_start`)
            self.store.count_measurements(job.job_id, wk, retries=1)
        send_round(self.app, again)
        return again.round_id
