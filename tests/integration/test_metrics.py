"""Prometheus metrics of a farm of two worker hosts add up to the store's truth.

One Redis, two worker hosts (prefork pools), each with its own tracker and one phone of key
`cpu-local`, each serving /metrics. A job runs over both; while it runs, both hosts' /metrics
are scraped over HTTP and added up as the dashboard (deploy/grafana/tunefarm.json) adds them:
the farm-wide counters come from one host only and equal the store's counts; after it, the
round times the pool processes observed add up to the store's.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest
import redis

from farm.local import services
from farm.store import open_store
from farm.store.store import total_counts
from tests.faults.conftest import wait_until
from tests.helpers import run_farm

pytestmark = pytest.mark.integration

HOSTS = ("farm@metrics1", "farm@metrics2")
Samples = dict[tuple[str, frozenset], float]


@pytest.fixture(scope="module")
def farm2(redis_url: str, tmp_path_factory: pytest.TempPathFactory):
    redis.Redis.from_url(redis_url).flushdb()
    logs = tmp_path_factory.mktemp("metrics-logs")
    group = services.ServiceGroup()
    env = {"FARM_HOST_TTL_S": "6", "FARM_SUPERVISOR_INTERVAL_S": "1"}
    try:
        from farm.devices.tracker import wait_for_phones

        metrics = {}
        for host in HOSTS:
            svc, addr = services.start_tracker(logs)
            group.add(svc)
            group.add(services.start_phone(addr, "cpu-local", 0, logs / host))
            wait_for_phones(addr, "cpu-local", 1, timeout_s=60)
            port = services.free_port()
            group.add(services.start_worker(
                addr, redis_url, logs, name=host.split("@")[1], env=dict(env),
                extra=["--hostname", host, "--concurrency", "1", "--metrics-port", str(port)]))
            metrics[host] = f"http://127.0.0.1:{port}/metrics"
        # a real Prometheus scraping both (every second: a rate() of the job's counters needs
        # two scrapes while the job is active, and this job may end within 5 s): the
        # dashboard's queries are asked of it
        prom_svc, prom = services.start_prometheus(
            [url.split("//")[1].split("/")[0] for url in metrics.values()],
            tmp_path_factory.mktemp("prometheus"), logs, services.free_port(), every_s=1)
        group.add(prom_svc)
        store = open_store(redis_url)
        yield {"redis": redis_url, "metrics": metrics, "store": store, "group": group,
               "prometheus": prom, "env": {"FARM_BROKER_URL": redis_url, **env}}
        store.close()
    finally:
        group.stop()


def scrape(url: str) -> Samples:
    """Prometheus' text format, parsed by prometheus_client: (name, labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape_all(farm2) -> dict[str, Samples]:
    return {host: scrape(url) for host, url in farm2["metrics"].items()}


def values(scraped: dict[str, Samples], name: str, **labels: str) -> dict[str, float]:
    """Per host, the sum of `name`'s samples with `labels` (hosts without one: left out)."""
    out: dict[str, float] = {}
    for host, samples in scraped.items():
        found = [v for (n, ls), v in samples.items()
                 if n == name and set(labels.items()) <= ls]
        if found:
            out[host] = sum(found)
    return out


def leader(farm2) -> str | None:
    try:
        got = scrape_all(farm2)
    except OSError:  # a host beats before its /metrics listens (a moment after): not yet
        return None
    leads = [h for h in HOSTS if got[h].get(("tunefarm_leader", frozenset({("host", h)}))) == 1]
    return leads[0] if len(leads) == 1 else None


def test_two_hosts_metrics_add_up_to_the_store(farm2, tmp_path: Path):
    from tests.faults.conftest import tiny_model

    store = farm2["store"]
    wait_until("both hosts' heartbeats", lambda: {h.name for h in store.hosts()} == set(HOSTS),
               timeout_s=120)
    lead = wait_until("one host leads and says so on /metrics", lambda: leader(farm2),
                      timeout_s=120)
    before = scrape_all(farm2)
    for host in HOSTS:  # a host serves its own phones, with its name, and its process
        # free + busy: its one phone (a sum over every label means something)
        assert values({host: before[host]}, "tunefarm_phones", host=host,
                      device_key="cpu-local") == {host: 1}
        assert all(dict(ls).get("host", host) == host for (n, ls) in before[host]
                   if n.startswith("tunefarm_")), host
        assert ("process_cpu_seconds_total", frozenset()) in before[host]
    model = tiny_model(tmp_path / "metrics.pt2", width=23, layers=2)
    proc = run_farm(["submit", str(model), "--trials-per-task", "6", "--round-trials", "2",
                     "--no-wait", "--out", str(tmp_path / "out")], tmp_path, env=farm2["env"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    job_id = json.loads(proc.stdout)["job_id"]
    stable, last_active = check_counters_while_running(farm2, job_id, lead)
    assert stable and stable["new"] > 0, "no scrape saw the job's measurements settled"
    done = run_farm(["wait", job_id], tmp_path, env=farm2["env"], timeout_s=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # the ended job's series outlive it (KEEP_ENDED_S): a scrape now sees its final counts
    final, scraped = total_counts(farm2["store"].job_counts(job_id)), scrape_all(farm2)
    for kind in ("new", "duplicates", "device_lost"):
        assert sum(values(scraped, "tunefarm_measurements_total", job_id=job_id,
                          kind=kind).values()) == final[kind], (kind, final)
    check_round_times(farm2, job_id, before)
    check_the_dashboard_in_prometheus(farm2, job_id, last_active)


def check_counters_while_running(farm2, job_id: str, lead: str) -> tuple[dict[str, int], float]:
    """Until the job ends: the store's counts read before and after scraping both hosts bound
    the dashboard's sum of the job's counters; equal when the store did not move. Returns the
    last settled counts and the last time the job was seen active."""
    store, stable, last_active = farm2["store"], {}, 0.0
    deadline = time.monotonic() + 600
    while job_id in store.active_jobs():
        assert time.monotonic() < deadline, "the job did not end in 600 s"
        s0 = total_counts(store.job_counts(job_id))
        scraped = scrape_all(farm2)
        s1 = total_counts(store.job_counts(job_id))
        for kind in s0:
            per_host = values(scraped, "tunefarm_measurements_total", job_id=job_id, kind=kind)
            if not per_host:  # not yet seen by the leader's scrape, or just finished
                continue
            total = sum(per_host.values())  # a sum over hosts is the farm's
            assert s0[kind] <= total <= s1[kind], (kind, s0, per_host, s1)
            assert set(per_host) == {lead}, (kind, per_host)  # served once, by the leader
            if s0 == s1:
                assert total == s0[kind] == max(per_host.values())
                stable = s0
        every = values(scraped, "tunefarm_measurements_total", job_id=job_id)
        if every and s0 == s1:  # the sum over every kind: each measurement once
            assert sum(every.values()) == s0["measurements"] + s0["device_lost"], (every, s0)
        tasks = values(scraped, "tunefarm_job_tasks", job_id=job_id)
        assert set(tasks) <= {lead} and sum(tasks.values()) in (0, 2), tasks
        last_active = time.time()
        time.sleep(0.3)
    return stable, last_active


def check_round_times(farm2, job_id: str, before: dict[str, Samples]) -> None:
    """The rounds' times the hosts' pool processes observed, summed over hosts, are the
    store's: measuring seconds as the job's task states add them up, a round or more each."""
    after = scrape_all(farm2)

    def delta(name: str) -> float:
        return sum(values(after, name).values()) - sum(values(before, name).values())

    states = farm2["store"].task_states(job_id)
    assert len(states) == 2 and all(s.state == "done" for s in states.values()), states
    measured = sum(s.measure_s for s in states.values())
    assert measured > 0
    assert delta("tunefarm_round_measure_seconds_sum") == pytest.approx(measured, abs=1e-6)
    rounds = delta("tunefarm_round_duration_seconds_count")
    assert len(states) <= rounds <= sum(s.rounds for s in states.values())
    assert delta("tunefarm_round_measure_seconds_count") == rounds
    assert delta("tunefarm_round_duration_seconds_sum") >= measured
    assert delta("tunefarm_round_queue_wait_seconds_count") >= len(states)
    for host in HOSTS:  # a host's round times carry its name only
        names = {dict(ls).get("host") for (n, ls) in after[host]
                 if n.startswith("tunefarm_round_duration_seconds")}
        assert names <= {host}, names


def prometheus(farm2, expr: str, at: float) -> list[dict]:
    """The result of an instant query of the fixture's Prometheus."""
    import urllib.parse

    query = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
    with urllib.request.urlopen(f"{farm2['prometheus']}/api/v1/query?{query}", timeout=10) as r:
        answer = json.loads(r.read())
    assert answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]


def check_the_dashboard_in_prometheus(farm2, job_id: str, at: float) -> None:
    """Each query of deploy/grafana/tunefarm.json (every variable at "All"), asked of a real
    Prometheus scraping both hosts at the last moment the job was active, is valid PromQL
    and has data; there the job's counters had one series each (the leader's). A rate() of
    a round-time histogram needs two scrapes since its first round ended: where the job
    ended before that, it is asked again at later moments (the histograms outlive the job)."""
    board = json.loads((Path(__file__).resolve().parents[2] / "deploy" / "grafana"
                        / "tunefarm.json").read_text())
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name in ("host", "device_key", "job_id"):
                expr = expr.replace(f"${name}", ".*")
            found = prometheus(farm2, expr, at)
            if not found and "_seconds_" in expr:
                found = wait_until(f"data for {panel['title']}",
                                   lambda e=expr: prometheus(farm2, e, time.time()),
                                   timeout_s=60)
            if "failed_candidates" not in expr:  # a series only once a candidate failed
                assert found, (panel["title"], expr)
    for kind in ("new", "duplicates", "device_lost"):
        series = prometheus(farm2, f'tunefarm_measurements_total{{job_id="{job_id}", '
                                   f'kind="{kind}"}}', at)
        assert len(series) == 1, (kind, series)
