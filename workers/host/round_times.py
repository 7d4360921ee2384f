"""A worker host's round times as Prometheus histograms, observed where a round runs.

A round runs in a pool process of the worker (prefork: a child forked from the worker's main
process), and only there are its times known: its wall time and, of it, the time its batches
spent on the phones (its `RoundResult`), and how long it waited between being queued (its
task state's `queued` stamp, written by whoever sent it) and a pool process taking it. They
are stored nowhere else, so they are observed there, not read from the store at scrape time.

prometheus_client's multiprocess mode carries them to /metrics: each process writes its
observations to its own file in the worker's folder (`PROMETHEUS_MULTIPROC_DIR`, set by
`multiprocess_folder` before the pool forks), and the main process's /metrics adds up the
files of every pool process, the recycled ones included (workers/host/metrics.py). Each host
observes only its own rounds (label `host`), so the farm's histogram is the sum over hosts
(`sum by (le) (rate(..._bucket[5m]))`). A restarted worker starts them from zero: a counter
reset, which rate() and increase() expect.

Thread safety: Celery calls `started` and `ended` in the process that runs the round.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

from farm.core.config import FarmConfig
from farm.core.messages import RoundRequest, RoundResult
from farm.jobs.dispatch import ROUND_TASK
from farm.store import RecordStore, configured_store
from farm.store.jobs import JobReader

log = logging.getLogger(__name__)
ROUND_BUCKETS_S = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600)
WAIT_BUCKETS_S = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600)
HISTOGRAMS = ("tunefarm_round_duration_seconds", "tunefarm_round_measure_seconds",
              "tunefarm_round_queue_wait_seconds")


def multiprocess_folder(home: Path) -> str:
    """A new folder for this worker's per-process metric files (`<home>/metrics/<pid>`),
    named in the environment the pool processes inherit. Call before the pool forks; the
    worker removes it when it ends, and the next worker of the machine removes those of
    workers that were killed before they could."""
    import psutil

    parent = home / "metrics"
    parent.mkdir(parents=True, exist_ok=True)
    for old in parent.iterdir():  # a worker killed outright (SIGKILL, OOM) left its folder
        if old.name.isdigit() and not psutil.pid_exists(int(old.name)):
            shutil.rmtree(old, ignore_errors=True)
    folder = parent / str(os.getpid())
    shutil.rmtree(folder, ignore_errors=True)  # a PID reused: not its files
    folder.mkdir()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder)
    from prometheus_client import values

    # prometheus_client picks its value class when first imported: if something imported it
    # before the folder was named, pick again (no metric of this process has a value yet)
    values.ValueClass = values.get_value_class()
    return str(folder)


class RoundTimes:
    """The three histograms of one worker host (`node`), fed by Celery's task signals."""

    def __init__(self, config: FarmConfig, node: str) -> None:
        from prometheus_client import Histogram

        labels = ["host", "device_key"]
        self.wall = Histogram(HISTOGRAMS[0], "Wall time of a round that ran on this host, "
                              "from its start to its result", labels, registry=None,
                              buckets=ROUND_BUCKETS_S)
        self.measure = Histogram(HISTOGRAMS[1], "Of a round's wall time, the time its batches "
                                 "spent on the phones (sent -> results back)", labels,
                                 registry=None, buckets=ROUND_BUCKETS_S)
        self.queue_wait = Histogram(HISTOGRAMS[2], "Time a round waited between being queued "
                                    "and a pool process of this host taking it", labels,
                                    registry=None, buckets=WAIT_BUCKETS_S)
        self.config = config
        self.node = node
        self._store: RecordStore | None = None
        self._pid = 0

    def connect(self) -> None:
        """Observe every round this worker's processes run (before the pool forks)."""
        from celery import signals

        signals.task_prerun.connect(self.started, weak=False)
        signals.task_postrun.connect(self.ended, weak=False)

    def started(self, task: object = None, args: object = None, **_: object) -> None:
        """A pool process took a round: its wait since it was queued (a round sent again
        waits from its new stamp; a retry, whose task is no longer `queued`, is not a wait)."""
        req = _request(task, args)
        if req is None:
            return
        try:
            state = self._store_here().task_states(req.job_id).get(req.workload_key)
        except Exception as e:  # noqa: BLE001 - a metric never fails a round
            log.warning("round %s: its queue wait is not observed: %s", req.round_id, e)
            return
        if (state is None or state.state != "queued" or not state.updated_at or not state.round
                or RoundRequest.from_json(state.round).logical_id != req.logical_id):
            return
        # the stamp is the sender's clock: a host's clock behind it would make it negative
        self.queue_wait.labels(self.node, req.device_key).observe(
            max(0.0, time.time() - state.updated_at))

    def ended(self, task: object = None, args: object = None, retval: object = None,
              **_: object) -> None:
        """A round returned: its wall and measuring time, when it ran (not skipped or fenced
        out: those measured nothing and did not move the job on)."""
        req = _request(task, args)
        if req is None or not isinstance(retval, dict) or "wall_s" not in retval:
            return
        result = RoundResult.from_json(retval)
        if result.skipped:
            return
        self.wall.labels(self.node, req.device_key).observe(result.wall_s)
        self.measure.labels(self.node, req.device_key).observe(result.measure_s)

    def _store_here(self) -> JobReader:
        """A store client of this process (a forked child makes its own)."""
        if self._store is None or self._pid != os.getpid():
            self._store, self._pid = configured_store(self.config), os.getpid()
        return self._store


def _request(task: object, args: object) -> RoundRequest | None:
    if getattr(task, "name", None) != ROUND_TASK or not isinstance(args, (list, tuple)) \
            or not args:
        return None
    try:
        return RoundRequest.from_json(args[0])
    except Exception:  # noqa: BLE001 - a malformed round fails in its task, not here
        return None
