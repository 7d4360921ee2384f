"""Prometheus metrics of a worker host: `farm worker --metrics-port PORT` serves /metrics.

Every number is read from the farm's store (and this host's broker queues) when Prometheus
scrapes, not counted in the process: a round runs in a pool child, a job's measurements are
counted by the store's own Lua commit, and two hosts scraped at once report the same job the
same way. So the counters are the farm's truth (the `duplicates` counter is the store's
"measured twice"), and a restarted worker does not reset them.

Served on loopback unless told (`metrics_host`): the numbers name jobs and hosts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from farm.core.errors import ServiceError
from farm.jobs.dispatch import queued_rounds
from farm.store import RecordStore
from farm.store.broker import BrokerQueues
from farm.store.store import total_counts

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.metrics_core import Metric

log = logging.getLogger(__name__)


class FarmCollector:
    """A prometheus_client collector over the store, for the host `node`."""

    def __init__(self, store: RecordStore, broker: BrokerQueues, node: str,
                 keys: list[str]) -> None:
        self.store = store
        self.broker = broker  # the broker's queue lists (read)
        self.node = node
        self.keys = keys

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        phones = GaugeMetricFamily("tunefarm_phones", "Phones on this host's tracker",
                                   labels=["host", "device_key", "state"])
        for beat in self.store.hosts():
            if beat.name != self.node:
                continue
            for key, counts in beat.phones.items():
                for state in ("total", "free", "busy"):
                    phones.add_metric([self.node, key, state], counts.get(state, 0))
        yield phones
        queued = GaugeMetricFamily("tunefarm_rounds_queued",
                                   "Rounds waiting in the broker for a phone of the key",
                                   labels=["device_key"])
        for key in self.keys:
            queued.add_metric([key], queued_rounds(self.broker, key))
        yield queued
        yield from self._jobs()
        yield GaugeMetricFamily("tunefarm_store_workloads", "Workloads in the record store",
                                value=len(self.store.workload_keys()))
        memory = self.store.memory()
        if memory is not None:  # its rate: deriv(); full when used reaches max (noeviction)
            gauge = GaugeMetricFamily("tunefarm_store_memory_bytes",
                                      "The store's Redis memory: used, and its maxmemory "
                                      "(0: none)", labels=["kind"])
            gauge.add_metric(["used"], memory[0])
            gauge.add_metric(["max"], memory[1])
            yield gauge

    def _jobs(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        running = GaugeMetricFamily("tunefarm_rounds_running",
                                    "Rounds tuning now on this host", labels=["device_key"])
        tasks = GaugeMetricFamily("tunefarm_job_tasks", "Tasks of an active job by state",
                                  labels=["job", "model", "state"])
        measured = CounterMetricFamily(
            "tunefarm_measurements", "Phone measurements of an active job, counted by the "
            "store: measurements, new records, duplicates (measured twice), device_lost",
            labels=["job", "model", "kind"])
        failed = CounterMetricFamily("tunefarm_failed_candidates",
                                     "Candidates of an active job that failed, by class",
                                     labels=["job", "model", "class"])
        here: dict[str, int] = dict.fromkeys(self.keys, 0)
        for job_id in self.store.active_jobs():
            job = self.store.get_job(job_id)
            if job is None:
                continue
            states = self.store.task_states(job_id)
            by_state: dict[str, int] = {}
            by_class: dict[str, int] = {}
            for s in states.values():
                by_state[s.state] = by_state.get(s.state, 0) + 1
                for k, v in s.failures.items():
                    by_class[k] = by_class.get(k, 0) + v
                if s.state == "tuning" and s.host == self.node:
                    here[job.device_key] = here.get(job.device_key, 0) + 1
            for state, n in sorted(by_state.items()):
                tasks.add_metric([job_id, job.model, state], n)
            for cls, n in sorted(by_class.items()):
                failed.add_metric([job_id, job.model, cls], n)
            for kind, n in total_counts(self.store.job_counts(job_id)).items():
                measured.add_metric([job_id, job.model, kind], n)
        for key, n in sorted(here.items()):
            running.add_metric([key], n)
        yield from (running, tasks, measured, failed)


def serve(store: RecordStore, broker: BrokerQueues, node: str, keys: list[str], host: str,
          port: int) -> WSGIServer:
    """Serve /metrics on host:port in a thread of this process; returns the server."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    registry.register(FarmCollector(store, broker, node, keys))
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise ServiceError(f"cannot serve metrics there: {e.strerror or e}",
                           subject=f"worker {node}, --metrics-port {host}:{port}",
                           hint="pick a free port, or leave --metrics-port out") from e
    log.info("worker %s: Prometheus metrics on http://%s:%d/metrics", node, host, port)
    return server
