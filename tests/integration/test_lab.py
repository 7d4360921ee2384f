"""Lab mode on one machine: one Redis, two worker hosts, each with its own tracker and phones.

Host 1's tracker has phones of keys `cpu-local` and `a`; host 2's of `cpu-local` and `b`.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import redis

from farm.local import services
from farm.store import open_store
from tests.helpers import run_farm

pytestmark = pytest.mark.integration

HOST1, HOST2 = "farm@host1", "farm@host2"


@pytest.fixture(scope="module")
def lab(redis_url: str, tmp_path_factory: pytest.TempPathFactory):
    redis.Redis.from_url(redis_url).flushdb()
    logs = tmp_path_factory.mktemp("lab-logs")
    group = services.ServiceGroup()
    env = {"FARM_HOST_TTL_S": "6", "FARM_ROUND_TRIALS": "2"}
    try:
        trackers = {}
        for host, keys in ((HOST1, ["cpu-local", "a"]), (HOST2, ["cpu-local", "b"])):
            svc, addr = services.start_tracker(logs)
            group.add(svc)
            for i, key in enumerate(keys):
                group.add(services.start_phone(addr, key, i, logs / host))
            from farm.devices.tracker import wait_for_phones

            for key in keys:
                wait_for_phones(addr, key, 1, timeout_s=60)
            trackers[host] = addr
        workers = {}
        for host, addr in trackers.items():  # their /metrics: tests/integration/test_metrics.py
            workers[host] = group.add(services.start_worker(
                addr, redis_url, logs, name=host.split("@")[1],
                extra=["--hostname", host], env={**env}))
        beating(redis_url, workers)  # a job submitted before a host's first beat finds no phones
        flower_port = services.free_port()
        group.add(services.start("flower", [sys.executable, "-m", "farm", "flower",
                                            "--broker", redis_url, "--port", str(flower_port),
                                            "--auth", "lab:secret"], logs))
        yield {"redis": redis_url, "trackers": trackers, "workers": workers, "logs": logs,
               "group": group, "env": {"FARM_BROKER_URL": redis_url, **env},
               "flower": f"http://127.0.0.1:{flower_port}"}
    finally:
        group.stop()


def beating(redis_url: str, workers: dict[str, services.Service], timeout_s: float = 120) -> None:
    """Until every worker's heartbeat is in the store."""
    store = open_store(redis_url)
    try:
        deadline = time.monotonic() + timeout_s
        while {h.name for h in store.hosts()} != set(workers):
            for w in workers.values():
                assert w.alive(), w.log_tail()
            assert time.monotonic() < deadline, f"no heartbeat of {set(workers)} in {timeout_s} s"
            time.sleep(0.5)
    finally:
        store.close()


def devices(lab, home: Path) -> list[dict]:
    proc = run_farm(["devices", "--json"], home, env=lab["env"], timeout_s=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["hosts"]


def wait_devices(lab, home: Path, want: set[str], timeout_s: float = 90) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = devices(lab, home)
        if {h["name"] for h in found} == want:
            return found
        for host, w in lab["workers"].items():
            assert w.alive() or host not in want, w.log_tail()
        time.sleep(1)
    raise AssertionError(f"hosts {want} not listed; have {devices(lab, home)}")


def hosts_of_records(redis_url: str, summary: dict) -> dict[str, set[str]]:
    store = open_store(redis_url)
    try:
        return {t["name"]: {r.host for r in store.records(t["workload_key"])}
                for t in summary["tasks"]}
    finally:
        store.close()


def test_devices_lists_both_hosts(lab, tmp_path):
    found = wait_devices(lab, tmp_path, {HOST1, HOST2})
    by_name = {h["name"]: h for h in found}
    assert by_name[HOST1]["tracker"] == lab["trackers"][HOST1]
    assert {k: v["total"] for k, v in by_name[HOST1]["phones"].items()} == {"cpu-local": 1, "a": 1}
    assert {k: v["total"] for k, v in by_name[HOST2]["phones"].items()} == {"cpu-local": 1, "b": 1}
    assert sorted(by_name[HOST2]["queues"]) == ["tune.b", "tune.cpu-local"]
    # both archive into the one folder of this machine: one id (read aside from the beats,
    # so it comes with a later one), and doctor says so
    deadline = time.monotonic() + 30
    while not all(h.get("archive_id") for h in found) and time.monotonic() < deadline:
        time.sleep(1)
        found = devices(lab, tmp_path)
    by_name = {h["name"]: h for h in found}
    assert by_name[HOST1]["archive_id"] and \
        by_name[HOST1]["archive_id"] == by_name[HOST2]["archive_id"], found
    from farm.client.doctor import check_archive

    check = check_archive(lab["redis"])
    assert check.ok and not check.warn and "share one archive" in check.detail, check


@pytest.fixture(scope="module")
def spread(lab, example_models, tmp_path_factory) -> dict:
    """The CNN tuned once on the lab (both hosts); tests that read its rounds share it."""
    tmp = tmp_path_factory.mktemp("spread")
    wait_devices(lab, tmp, {HOST1, HOST2})
    out = tmp / "spread"
    proc = run_farm(["submit", str(example_models / "resnet.pt2"), "--trials-per-task", "4",
                     "--out", str(out), "--tracker", lab["trackers"][HOST1], "--timeout", "900"],
                    tmp, env=lab["env"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"out": out, "summary": json.loads((out / "summary.json").read_text())}


def test_one_job_spreads_over_both_hosts(lab, spread):
    summary, out = spread["summary"], spread["out"]
    by_task = hosts_of_records(lab["redis"], summary)
    all_hosts = set().union(*by_task.values())
    assert all_hosts == {HOST1, HOST2}, by_task
    assert all(t["best_us"] is not None for t in summary["tasks"])
    assert summary["numerics_ok"]

    from tvm.s_tir.meta_schedule.database import JSONDatabase

    assert len(JSONDatabase(work_dir=str(out / "best")).get_all_tuning_records()) == \
        len(summary["tasks"])


def flower_tasks(lab) -> dict:
    req = urllib.request.Request(f"{lab['flower']}/api/tasks")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"lab:secret").decode())
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def test_flower_shows_the_rounds_by_name(lab, spread):
    deadline = time.monotonic() + 30
    rounds = {}
    while time.monotonic() < deadline:
        tasks = flower_tasks(lab)
        rounds = {k: v for k, v in tasks.items() if str(v.get("name", "")).startswith("resnet:")}
        if rounds:
            break
        time.sleep(1)
    assert rounds, "Flower lists no round of the resnet job"
    some = next(iter(rounds.values()))
    assert "round" in some["name"] and "[cpu-local]" in some["name"]
    assert {v.get("worker") for v in rounds.values()} & {HOST1, HOST2}
    assert any(v.get("state") == "SUCCESS" for v in rounds.values())
    unauth = urllib.request.Request(f"{lab['flower']}/api/tasks")
    try:
        urllib.request.urlopen(unauth, timeout=10)
        raise AssertionError("Flower answered without basic auth")
    except urllib.error.HTTPError as e:
        assert e.code == 401


def test_every_key_in_the_shared_redis_is_the_farms(lab, spread):
    """The broker's database may be shared with other users: after a whole job, every key in
    it, the farm's and Celery's (queues, unacked rounds, results, bindings), is under
    `tunefarm:`; Celery's under `tunefarm:celery:`."""
    import redis

    client = redis.Redis.from_url(lab["redis"], decode_responses=True)
    try:
        names = list(client.scan_iter(count=1000))
    finally:
        client.close()
    assert names and all(n.startswith("tunefarm:") for n in names), \
        sorted(n for n in names if not n.startswith("tunefarm:"))[:20]
    celery = [n for n in names if n.startswith("tunefarm:celery:")]
    job = spread["summary"]["job_id"]  # the job's rounds' results, prefixed
    assert any(n.startswith(f"tunefarm:celery:celery-task-meta-{job}:") for n in celery), \
        celery[:20]
    assert any("_kombu.binding.tune.cpu-local" in n for n in celery), celery[:20]


def test_a_key_only_runs_on_hosts_that_have_it(lab, tmp_path):
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(32, 16)

        def forward(self, x):
            return torch.relu(self.fc(x))

    model = tmp_path / "tiny.pt2"
    torch.export.save(torch.export.export(Tiny().eval(), (torch.randn(4, 32),)), model)
    out = tmp_path / "b"
    proc = run_farm(["submit", str(model), "--trials-per-task", "2", "--device-key", "b",
                     "--out", str(out), "--tracker", lab["trackers"][HOST2], "--timeout", "600"],
                    tmp_path, env=lab["env"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    by_task = hosts_of_records(lab["redis"], summary)
    assert set().union(*by_task.values()) == {HOST2}, by_task


def test_two_jobs_sharing_a_workload_tune_it_once(lab, tmp_path):
    import subprocess

    import torch

    class Shared(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(48, 24)

        def forward(self, x):
            return torch.relu(self.fc(x))

    model = tmp_path / "shared.pt2"
    torch.export.save(torch.export.export(Shared().eval(), (torch.randn(8, 48),)), model)
    wait_devices(lab, tmp_path, {HOST1, HOST2})
    env = {**os.environ, "FARM_HOME": str(tmp_path / "home"), **lab["env"]}
    procs = [subprocess.Popen([sys.executable, "-m", "farm", "submit", str(model),
                               "--trials-per-task", "4", "--out", str(tmp_path / f"job{i}"),
                               "--tracker", lab["trackers"][HOST1], "--timeout", "600"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i in range(2)]
    errs = [p.communicate(timeout=900)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    summaries = [json.loads((tmp_path / f"job{i}" / "summary.json").read_text()) for i in range(2)]
    store = open_store(lab["redis"])
    for t0, t1 in zip(summaries[0]["tasks"], summaries[1]["tasks"], strict=True):
        wk = t0["workload_key"]
        assert t1["workload_key"] == wk
        count = store.record_count(wk)
        if t0["state"] == "done" and t1["state"] == "done":
            assert count == 4, (wk, count)  # tuned once: not 4 per job
        assert t0["trials_measured"] + t1["trials_measured"] == count


def test_a_key_no_host_has_fails_fast(lab, example_models, tmp_path):
    t0 = time.monotonic()
    proc = run_farm(["submit", str(example_models / "resnet.pt2"), "--device-key", "ghost",
                     "--out", str(tmp_path / "ghost")], tmp_path, env=lab["env"], timeout_s=300)
    assert proc.returncode == 5, proc.stderr
    assert "no worker host has phones of key 'ghost'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - t0 < 120


def mlp_model(path: Path, sizes: list[int]) -> Path:
    """Linear+ReLU layers of the given sizes, saved with torch.export."""
    import torch

    layers: list[torch.nn.Module] = []
    for a, b in zip(sizes, sizes[1:], strict=False):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    torch.manual_seed(0)
    net = torch.nn.Sequential(*layers).eval()
    torch.export.save(torch.export.export(net, (torch.randn(4, sizes[0]),)), path)
    return path


def test_two_models_sharing_an_operator_tune_it_once(lab, tmp_path):
    first = mlp_model(tmp_path / "one.pt2", [40, 20])
    second = mlp_model(tmp_path / "two.pt2", [40, 20, 6])  # the same first layer, and one more
    wait_devices(lab, tmp_path, {HOST1, HOST2})
    summaries = []
    for model in (first, second):
        out = tmp_path / model.stem
        proc = run_farm(["submit", str(model), "--trials-per-task", "2", "--out", str(out),
                         "--tracker", lab["trackers"][HOST1], "--timeout", "600"], tmp_path,
                        env=lab["env"])
        assert proc.returncode == 0, proc.stderr[-3000:]
        summaries.append(json.loads((out / "summary.json").read_text()))
    one = {t["workload_key"]: t for t in summaries[0]["tasks"]}
    two = {t["workload_key"]: t for t in summaries[1]["tasks"]}
    shared = set(one) & set(two)
    assert shared and set(two) - shared, (list(one), list(two))  # one shared, one new operator
    store = open_store(lab["redis"])
    for wk in shared:
        assert two[wk]["trials_measured"] == 0  # served from the store: not tuned again
        assert two[wk]["trials_from_store"] == store.record_count(wk) >= 1
        assert two[wk]["best_us"] == one[wk]["best_us"]
    for wk in set(two) - shared:
        assert two[wk]["trials_measured"] >= 1


def test_a_dead_client_is_taken_over_by_farm_wait(lab, tmp_path):
    import subprocess

    model = mlp_model(tmp_path / "orphan.pt2", [36, 18, 9])
    out = tmp_path / "orphan-out"
    wait_devices(lab, tmp_path, {HOST1, HOST2})
    store = open_store(lab["redis"])
    before = set(store.job_ids())
    env = {**os.environ, "FARM_HOME": str(tmp_path / "home"), **lab["env"]}
    client = subprocess.Popen([sys.executable, "-m", "farm", "submit", str(model),
                               "--trials-per-task", "4", "--out", str(out),
                               "--tracker", lab["trackers"][HOST1]],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        job_id, deadline = None, time.monotonic() + 600
        while time.monotonic() < deadline and client.poll() is None:
            new = set(store.job_ids()) - before
            if new:
                job_id = new.pop()
                if sum(store.job_measured(job_id).values()) >= 1:
                    break
            time.sleep(0.5)
        assert job_id is not None and client.poll() is None, "the job ended before the kill"
    finally:
        client.kill()  # SIGKILL: no clean-up at all
        client.wait()
    assert not (out / "summary.json").exists()
    proc = run_farm(["wait", job_id], tmp_path, env=lab["env"], timeout_s=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())  # the job's own --out
    assert summary["job_id"] == job_id and summary["numerics_ok"]
    status = store.job_status(job_id)
    assert status["state"] == "finalized" and status["finalized_by"], status
    picks = store.final_picks(job_id)
    assert summary["measurements"]["duplicates"] == 0, summary["measurements"]
    for t in summary["tasks"]:
        records = store.records(t["workload_key"])
        best = min((r for r in records if r.valid), key=lambda r: r.run_us)
        assert picks[t["workload_key"]] == best.candidate  # finalized once, with the best
        assert t["best_us"] == pytest.approx(best.run_us, rel=1e-3, abs=1e-3)
    again = run_farm(["wait", job_id, "--out", str(tmp_path / "again")], tmp_path,
                     env=lab["env"], timeout_s=900)  # a second waiter: same final choice
    assert again.returncode == 0, again.stderr[-3000:]
    assert store.job_status(job_id)["finalized_by"] == status["finalized_by"]
    assert store.final_picks(job_id) == picks


def test_flower_shows_a_running_round_in_progress(lab, tmp_path):
    from urllib.parse import quote

    from celery.result import AsyncResult

    from farm.core.config import load_config
    from farm.jobs.dispatch import make_app

    model = mlp_model(tmp_path / "progress.pt2", [30, 15])
    wait_devices(lab, tmp_path, {HOST1, HOST2})
    # rounds of 32 trials, and more rounds than the test waits for: the job still runs (its
    # name held) when the twin below is submitted, however fast this round is; the test
    # cancels it at its end
    proc = run_farm(["submit", str(model), "--trials-per-task", "128", "--round-trials", "32",
                     "--out", str(tmp_path / "p"), "--no-wait", "--name", "progress.demo"],
                    tmp_path, env=lab["env"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    job_id = json.loads(proc.stdout)["job_id"]
    app = make_app(load_config({"broker_url": lab["redis"]}))
    seen, deadline = None, time.monotonic() + 600
    try:
        while seen is None and time.monotonic() < deadline:
            for task_id, t in flower_tasks(lab).items():
                if not task_id.startswith(job_id):
                    continue
                req = urllib.request.Request(f"{lab['flower']}/api/task/result/"
                                             f"{quote(task_id, safe='')}")
                req.add_header("Authorization",
                               "Basic " + base64.b64encode(b"lab:secret").decode())
                with urllib.request.urlopen(req, timeout=10) as resp:
                    shown = json.loads(resp.read())["state"]
                result = AsyncResult(task_id, app=app)
                meta = result.info
                if shown == "PROGRESS" and result.state == "PROGRESS":  # not ended meanwhile
                    seen = (task_id, t, meta)
                    break
            time.sleep(0.5)
        if seen is not None:  # while its round runs: the job's name finds it, and a second
            # job of that name is refused (before its model is read)
            named = run_farm(["status", "progress.demo", "--json"], tmp_path, env=lab["env"])
            assert named.returncode == 0, named.stderr[-2000:]
            assert [(v["job_id"], v["name"]) for v in json.loads(named.stdout)] == [
                (job_id, "progress.demo")]
            twin = run_farm(["submit", str(model), "--trials-per-task", "4", "--no-wait",
                             "--out", str(tmp_path / "twin"), "--name", "progress.demo"],
                            tmp_path, env=lab["env"])
            assert twin.returncode == 2 and f"held by job {job_id}" in twin.stderr, twin.stderr
    finally:
        cancelled = run_farm(["cancel", "progress.demo"], tmp_path, env=lab["env"], timeout_s=60)
    assert cancelled.returncode == 0 and job_id in cancelled.stdout, cancelled.stderr
    assert seen is not None, "Flower never showed a round in PROGRESS"
    task_id, task, meta = seen
    assert "progress:fused" in task["name"] and re.search(r"round \d+", task["name"]), task
    assert meta["job"] == job_id and meta["trials_total"] == 32
    assert 0 < meta["trials_done"] < 32 and meta["host"] in (HOST1, HOST2)
    assert meta["best_us"] is None or meta["best_us"] > 0


def test_a_killed_host_disappears_after_its_heartbeat_expires(lab, tmp_path):
    """A third host joins (on host 2's tracker) and is SIGKILLed: the lab's own hosts stay."""
    host3 = "farm@host3"
    wait_devices(lab, tmp_path, {HOST1, HOST2})
    worker = lab["group"].add(services.start_worker(
        lab["trackers"][HOST2], lab["redis"], lab["logs"], name="host3",
        extra=["--hostname", host3], env=dict(lab["env"])))
    wait_devices(lab, tmp_path, {HOST1, HOST2, host3})
    worker.signal(signal.SIGKILL)
    wait_devices(lab, tmp_path, {HOST1, HOST2}, timeout_s=60)


def test_the_python_api_submits_to_the_lab_and_waits_later(lab, tmp_path, monkeypatch):
    """farm.Farm(broker=...): an nn.Module submitted without waiting; the job is followed
    through the API (status from the store, then wait: finalized and compiled here)."""
    import torch

    import farm

    monkeypatch.setenv("FARM_HOME", str(tmp_path / "home"))
    wait_devices(lab, tmp_path, {HOST1, HOST2})
    torch.manual_seed(19)
    net = torch.nn.Sequential(torch.nn.Linear(19, 8), torch.nn.ReLU())
    on_lab = farm.Farm(broker=lab["redis"], settings={"round_trials": 2})
    assert not on_lab.embedded
    job = on_lab.submit(net, example_inputs=(torch.randn(2, 19),), trials_per_task=2,
                        out=tmp_path / "out", wait=False, name="api-job")
    assert job.summary is None  # dispatched, not finished
    assert job.status()["job_id"] == job.job_id
    assert on_lab.job("api-job").job_id == job.job_id  # found by its name
    summary = job.wait(timeout_s=600)
    assert summary["job_id"] == job.job_id and summary["numerics_ok"]
    assert (tmp_path / "out" / "model.so").is_file()
    hosts = set().union(*hosts_of_records(lab["redis"], summary).values())
    assert hosts <= {HOST1, HOST2} and hosts  # measured on the lab's phones


def test_flower_pages_name_each_round_in_a_browser(lab, spread, tmp_path):
    """Flower's tasks page, rendered by a real Chromium (its table fills itself in with
    JavaScript): each round reads as model, task, round and device key, with its worker."""
    from tests.helpers import browser_dom, png_pixels

    host_port = lab["flower"].split("//", 1)[1]
    # filtered by the model, as README says: the module's other jobs may fill the first page
    page = f"http://lab:secret@{host_port}/tasks?name=resnet"
    dom = browser_dom(page, png=tmp_path / "flower.png")  # the picture, for whoever looks
    names = re.findall(r"resnet:fused\w* round \d+ \[cpu-local\]", dom)
    assert names, dom[-3000:]
    assert HOST1 in dom or HOST2 in dom  # the worker that ran it
    rows = re.findall(r'<tr[^>]*id="([^"]+)"', dom)
    assert rows and all(r.startswith(spread["summary"]["job_id"]) for r in rows), rows
    pixels = png_pixels(tmp_path / "flower.png")
    assert len({p for p in pixels[::97]}) > 20  # a rendered page, not a blank one
