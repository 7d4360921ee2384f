"""Prometheus metrics of a worker host: `farm worker --metrics-port PORT` serves /metrics.

Two kinds of series, so that a dashboard over every host adds up to the farm:

- *farm-wide* ones (FARM_WIDE: a job's measurements, duplicates, failures and tasks, the
  best latency of its tasks, the broker's queues, the store's size) are served by the host
  whose supervisor leads the farm (farm/jobs/supervisor.py), and by no other: one series per
  fact, whichever hosts Prometheus scrapes. When the lead moves, the series move with it
  (another `instance`, same values). Dashboards take their `max` over instances, which also
  holds for the one scrape in which the old and the new leader may both serve them.
  `tunefarm_leader{host}` says which host serves them (1), on every host.
- *per-host* ones (PER_HOST: this host's phones and rounds running, its cores and the cores
  its phones need, its rounds' times) carry
  the label `host` and are served by that host only; a sum over hosts is the farm's.

The farm-wide numbers are read from the store when Prometheus scrapes, not counted in the
process: the store's own Lua commit counts a job's measurements (`duplicates` is the store's
"measured twice"), so a restarted worker or a new leader resets nothing. A finished job's
series end with it. The round times are observed where rounds run (workers/host/round_times.py).
Process metrics (`process_*`, `python_info`) are those of the worker's main process.

Served on loopback unless told (`metrics_host`): the numbers name jobs and hosts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from farm.core.errors import ServiceError
from farm.core.messages import JobSpec
from farm.jobs.dispatch import queued_rounds
from farm.store import TaskState
from farm.store.broker import BrokerQueues
from farm.store.store import FarmView, total_counts
from workers.host.round_times import HISTOGRAMS

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.metrics_core import Metric

log = logging.getLogger(__name__)
FARM_WIDE = ("tunefarm_measurements", "tunefarm_failed_candidates", "tunefarm_round_retries",
             "tunefarm_job_tasks", "tunefarm_best_latency_seconds", "tunefarm_rounds_queued",
             "tunefarm_store_workloads", "tunefarm_store_memory_used_bytes",
             "tunefarm_store_memory_max_bytes")
PER_HOST = ("tunefarm_leader", "tunefarm_phones", "tunefarm_rounds_running", "tunefarm_host_cores",
            "tunefarm_host_cores_needed", *HISTOGRAMS)
JOB = ["job_id", "model"]  # `job_id`: Prometheus's own `job` is the scrape job
# a job's series outlive it by this long: scrapes (every 15-60 s) see its final counts and
# states; then they end, so that `job_id` does not grow without bound
KEEP_ENDED_S = 600.0


@dataclass(frozen=True)
class ActiveJob:
    """An active job as one scrape reads it."""

    spec: JobSpec
    states: dict[str, TaskState]


class FarmCollector:
    """A prometheus_client collector over the store, for the host `node`, which serves the
    farm-wide series while `leads()` says its supervisor leads."""

    def __init__(self, store: FarmView, broker: BrokerQueues, node: str,
                 leads: Callable[[], bool], clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.broker = broker  # the broker's queue lists (read)
        self.node = node
        self.leads = leads
        self.clock = clock
        self.ended: dict[str, float | None] = {}  # job seen active -> when it was seen ended

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        leads = self.leads()
        leader = GaugeMetricFamily("tunefarm_leader", "1 on the host that leads the farm and "
                                   "serves its farm-wide series, else 0", labels=["host"])
        leader.add_metric([self.node], 1 if leads else 0)
        yield leader
        jobs = self._active()
        yield from self._host(jobs)
        if leads:
            yield from self._jobs(jobs)
            yield from self._farm(jobs)

    def _active(self) -> list[ActiveJob]:
        """The active jobs, and those this collector saw active that ended less than
        KEEP_ENDED_S ago: their last counts reach a scrape, then their series end."""
        now, active = self.clock(), self.store.active_jobs()
        for job_id in active:
            self.ended[job_id] = None
        for job_id, at in list(self.ended.items()):
            if job_id not in active and at is None:
                self.ended[job_id] = at = now
            if at is not None and now - at > KEEP_ENDED_S:
                del self.ended[job_id]
        out = []
        for job_id in sorted(self.ended):
            spec = self.store.get_job(job_id)
            if spec is not None:
                out.append(ActiveJob(spec, self.store.task_states(job_id)))
        return out

    def _host(self, jobs: list[ActiveJob]) -> Iterator[Metric]:
        """This host's series: its phones by state, its rounds running."""
        from prometheus_client.core import GaugeMetricFamily

        phones = GaugeMetricFamily("tunefarm_phones", "Phones on this host's tracker, free "
                                   "or busy (their sum: the phones)",
                                   labels=["host", "device_key", "state"])
        running = GaugeMetricFamily("tunefarm_rounds_running", "Rounds tuning now on this host",
                                    labels=["host", "device_key"])
        cores = GaugeMetricFamily("tunefarm_host_cores", "Cores this host's rounds may use",
                                  labels=["host"])
        needed = GaugeMetricFamily(
            "tunefarm_host_cores_needed", "Cores this host's rounds need to keep the key's "
            "phones busy, measured (above tunefarm_host_cores: the phones wait for CPU)",
            labels=["host", "device_key"])
        here: dict[str, int] = {}
        for beat in self.store.hosts():
            if beat.name != self.node:
                continue
            if beat.cores:
                cores.add_metric([self.node], beat.cores)
            for key, need in beat.cores_needed.items():
                needed.add_metric([self.node, key], need)
            for key, counts in beat.phones.items():
                here.setdefault(key, 0)
                for state in ("free", "busy"):
                    phones.add_metric([self.node, key, state], counts.get(state, 0))
        for job in jobs:
            tuning = sum(s.state == "tuning" and s.host == self.node for s in job.states.values())
            if tuning or job.spec.device_key in here:
                here[job.spec.device_key] = here.get(job.spec.device_key, 0) + tuning
        for key, n in sorted(here.items()):
            running.add_metric([self.node, key], n)
        yield from (phones, running, cores, needed)

    def _jobs(self, jobs: list[ActiveJob]) -> Iterator[Metric]:
        """Per active job (farm-wide): its tasks, the store's counts, failures, best latency."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        tasks = GaugeMetricFamily("tunefarm_job_tasks", "Tasks of an active job by state (its series end 10 minutes after it)",
                                  labels=[*JOB, "state"])
        measured = CounterMetricFamily(
            "tunefarm_measurements", "Phone measurements of an active job by outcome, counted "
            "by the store: a new record, a duplicate (a stored candidate measured twice), "
            "device_lost (the phone went away); their sum: every measurement",
            labels=[*JOB, "kind"])
        failed = CounterMetricFamily("tunefarm_failed_candidates",
                                     "Candidates of an active job that failed, by class",
                                     labels=[*JOB, "class"])
        retries = CounterMetricFamily("tunefarm_round_retries", "Rounds of an active job run "
                                      "again (lost, or began tuning again)", labels=JOB)
        best = GaugeMetricFamily("tunefarm_best_latency_seconds", "Best run time in the store "
                                 "of each task of an active job (none yet: no series)",
                                 labels=[*JOB, "task"])
        for job in jobs:
            ids = [job.spec.job_id, job.spec.model]
            by_state: dict[str, int] = {}
            by_class: dict[str, int] = {}
            for s in job.states.values():
                by_state[s.state] = by_state.get(s.state, 0) + 1
                for k, v in s.failures.items():
                    by_class[k] = by_class.get(k, 0) + v
            for state, n in sorted(by_state.items()):
                tasks.add_metric([*ids, state], n)
            for cls, n in sorted(by_class.items()):
                failed.add_metric([*ids, cls], n)
            counts = self.store.job_counts(job.spec.job_id)
            for kind, n in total_counts(counts).items():
                if kind != "measurements":  # new + duplicates: the parent of two parts
                    measured.add_metric([*ids, kind], n)
            retries.add_metric(ids, sum(row.get("retries", 0) for row in counts.values()))
            for wk in job.spec.workload_keys:
                rec = self.store.best(wk)
                if rec is not None and rec.run_us:
                    best.add_metric([*ids, job.spec.task_names.get(wk, wk)], rec.run_us * 1e-6)
        yield from (tasks, measured, failed, retries, best)

    def _farm(self, jobs: list[ActiveJob]) -> Iterator[Metric]:
        """The broker's queue of every device key a live host or an active job has, and the
        store's size."""
        from prometheus_client.core import GaugeMetricFamily

        keys = {k for beat in self.store.hosts() for k in beat.phones}
        keys |= {job.spec.device_key for job in jobs}
        queued = GaugeMetricFamily("tunefarm_rounds_queued",
                                   "Rounds waiting in the broker for a phone of the key",
                                   labels=["device_key"])
        for key in sorted(keys):
            queued.add_metric([key], queued_rounds(self.broker, key))
        yield queued
        yield GaugeMetricFamily("tunefarm_store_workloads", "Workloads in the record store",
                                value=len(self.store.workload_keys()))
        memory = self.store.memory()
        if memory is not None:  # its rate: deriv(); full when used reaches max (noeviction)
            yield GaugeMetricFamily("tunefarm_store_memory_used_bytes",
                                    "The store's Redis memory in use", value=memory[0])
            yield GaugeMetricFamily("tunefarm_store_memory_max_bytes",
                                    "The store's Redis maxmemory (0: none)", value=memory[1])


def serve(collector: FarmCollector, host: str, port: int,
          multiprocess: str | None = None) -> WSGIServer:
    """Serve /metrics on host:port in a thread of this process: `collector`'s series, the
    round times the pool processes wrote to the folder `multiprocess` (round_times.py), and
    this process's own metrics. Returns the server."""
    from prometheus_client import (
        CollectorRegistry,
        PlatformCollector,
        ProcessCollector,
        start_http_server,
    )

    registry = CollectorRegistry()
    registry.register(collector)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    if multiprocess is not None:
        from prometheus_client.multiprocess import MultiProcessCollector

        MultiProcessCollector(registry, path=multiprocess)
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise ServiceError(f"cannot serve metrics there: {e.strerror or e}",
                           subject=f"worker {collector.node}, --metrics-port {host}:{port}",
                           hint="pick a free port, or leave --metrics-port out") from e
    log.info("worker %s: Prometheus metrics on http://%s:%d/metrics", collector.node, host, port)
    return server
