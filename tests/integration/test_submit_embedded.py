"""The spine, for real: `farm submit` on the embedded default (private Redis, a tracker,
two emulated phones, a Celery worker process), then the same model again from the store."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import alive, logs_tail, run_farm, started_pids

pytestmark = pytest.mark.integration


def load_log_in_plain_tvm(best_dir: Path, summary: dict) -> int:
    """Every task's best record, read back with nothing but TVM's own JSONDatabase."""
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    db = JSONDatabase(work_dir=str(best_dir))
    records = db.get_all_tuning_records()
    assert all(r.run_secs is not None and max(float(s) for s in r.run_secs) < 1e9
               for r in records), "a failed record (1e10) leaked into the best-config log"
    return len(records)


VICTIMS = ("redis", "tracker", "phone-cpu-local-1", "worker")  # killed mid-job by first_run


def live_pid(home: Path, name: str, within_s: float = 60.0) -> int:
    """The PID of the embedded farm's service `name` under `home`, once it runs (it may be
    between a death of its own and its restart)."""
    deadline = time.monotonic() + within_s
    while not (pids := [pid for pid, seen in started_pids(home) if seen == name and alive(pid)]):
        assert time.monotonic() < deadline, (name, started_pids(home), logs_tail(home))
        time.sleep(0.2)
    return pids[-1]


@pytest.fixture(scope="module")
def first_run(example_models: Path, tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("farm-home")
    out = tmp_path_factory.mktemp("runs") / "first"
    # a dead worker's lease; 2 whole records per workload in Redis, the rest in the archive;
    # phones that take 0.25 s to load a kernel, as a real one's upload does: the tuning lasts
    # ~15 s, not 7, so that the services below die while tasks are still tuning
    env = {**os.environ, "FARM_HOME": str(home), "FARM_HOST_TTL_S": "6", "FARM_HOT_RECORDS": "2",
           "FARM_PHONE_DELAY_S": "0.25"}
    env.pop("FARM_BROKER_URL", None)
    popen = subprocess.Popen([sys.executable, "-m", "farm", "submit",
                              str(example_models / "resnet.pt2"), "--trials-per-task", "4",
                              "--round-trials", "4", "--out", str(out), "--timeout", "1500"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    status = None  # `farm status --json` from another terminal while the job runs
    while popen.poll() is None and status is None:
        seen = run_farm(["status", "--json"], home, timeout_s=60)
        jobs = json.loads(seen.stdout) if seen.returncode == 0 else []
        # mid-job: its rounds measure (the client has sent them all) and a task still tunes
        if jobs and jobs[0]["trials_measured"] >= 1 and \
                any(t["state"] != "done" for t in jobs[0]["tasks"]):
            status = jobs
            # Redis, the tracker, a phone and the worker die mid-job (killed by the OS): the
            # farm starts them again; Redis from its AOF, the phones register at the tracker
            # again, the worker's round in flight is sent again once its lease expires
            for victim in VICTIMS:  # (`farm status` may have started a Redis of its own)
                os.kill(live_pid(home, victim), signal.SIGKILL)
        time.sleep(0.5)
    stdout, stderr = popen.communicate(timeout=1800)
    proc = subprocess.CompletedProcess(popen.args, popen.returncode, stdout, stderr)
    return home, out, proc, status


def test_submit_tunes_compiles_and_checks(first_run):
    home, out, proc, _ = first_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    for field in ("job_id", "model", "device_key", "target", "tasks", "latency_us",
                  "numerics_ok", "wall_s", "schedules"):
        assert field in summary
    assert summary["device_key"] == "cpu-local"
    from farm.devices.hostcpu import split_cpu, system_cpu

    mcpu, hidden = split_cpu(system_cpu())  # tuned for this very CPU, what it hides off
    assert summary["target"].get("mcpu") == mcpu and summary["target"].get("mattr", []) == hidden
    tasks = summary["tasks"]
    assert len(tasks) >= 3
    for t in tasks:
        assert t["trials_measured"] + t["trials_from_store"] >= 1, t
        assert t["best_us"] is not None and t["best_us"] > 0, t
        # TVM's default schedule was measured with the task's first batch: the job's best is
        # never one that is slower than what an untuned build runs
        assert t["single_schedule"] or t["default_us"] is not None, t
        # a fresh farm: each best was this job's search, TVM's default schedule (measured by
        # this job's first batch; it wins where no candidate beat it), or a schedule carried
        # over from a task of the same family this job tuned first
        assert t["best_from"] in ("searched", "TVM's default schedule") \
            or t["best_from"].startswith("transferred from "), t
        if t["best_from"] == "TVM's default schedule":
            assert t["best_us"] == t["default_us"], t
    assert summary["numerics_ok"] is True
    lat = summary["latency_us"]
    assert lat["tuned"] < lat["untuned"], lat
    assert lat["torch"] > 0
    assert sorted(summary["schedules"]["from_log"]) == sorted(t["name"] for t in tasks)
    assert load_log_in_plain_tvm(out / "best", summary) == len(tasks)
    assert (out / "model.so").stat().st_size > 0
    assert "speed-up" in proc.stdout and "default us" in proc.stdout and "best from" in proc.stdout
    # the host CPU its rounds took, per part (workers/round/account.py), per task and in all
    cpu = summary["cpu"]
    assert all(cpu["phone_hosts_s"].get(p, 0) > 0 for p in ("search", "build", "phones")), cpu
    # (not a round the killed worker ran: its account died with it)
    assert sum(t["cpu_s"] > 0 for t in tasks) >= len(tasks) // 2, tasks
    assert 0 < cpu["per_trial_s"] < cpu["total_s"], cpu
    assert "host CPU" in proc.stdout
    # the workers' logs say what the farm did, not MetaSchedule's INFO lines posing as warnings
    worker_logs = "".join(p.read_text() for p in home.glob("logs/*/worker.log"))
    assert "round 1 of" in worker_logs
    assert "[INFO] [" not in worker_logs, [
        line for line in worker_logs.splitlines() if "[INFO] [" in line][:3]


def test_every_phone_measurement_is_on_a_named_phone(first_run):
    """summary.json's phones: both emulated phones, each measurement on one of them, busy
    seconds within the tuning wall; the store keeps the same per phone."""
    home, out, proc, _ = first_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    phones = summary["phones"]
    assert len(phones) == 2 and all(p["phone"].startswith("127.0.0.1:") for p in phones), phones
    # every run the store counted was on one of them (no phone was lost in this job)
    assert sum(p["measurements"] for p in phones) == summary["measurements"]["measurements"]
    wall = summary["tuning_wall_s"]
    for p in phones:
        assert p["measurements"] > 0 and 0 < p["busy_s"] <= wall, p  # pulled by both phones
        assert p["utilization"] == pytest.approx(p["busy_s"] / wall, abs=0.01)
        assert p["mean_ms"] == pytest.approx(1000 * p["busy_s"] / p["measurements"], rel=0.01)
    assert 0 < summary["phone_utilization"] <= 1
    listed = run_farm(["devices", "--json"], home, timeout_s=120)
    assert listed.returncode == 0, listed.stderr
    stats = {p["phone"]: p for p in json.loads(listed.stdout)["phones"]}
    for p in phones:  # totals since the farm began: at least this job's
        assert stats[p["phone"]]["measurements"] >= p["measurements"], stats


def test_report_is_self_contained(first_run):
    import re
    from html.parser import HTMLParser

    _, out, proc, _ = first_run
    assert proc.returncode == 0
    page = (out / "report.html").read_text()
    HTMLParser().feed(page)  # well-formed enough to parse
    summary = json.loads((out / "summary.json").read_text())
    assert page.count('class="curve"') == len(summary["tasks"])  # one tuning curve per task
    for t in summary["tasks"]:
        assert t["name"] in page
    assert not re.search(r'(src|href)="https?:', page)  # nothing fetched from the network
    assert "TVM tuned" in page and "torch eager" in page


def test_report_renders_in_a_browser_without_network(first_run, tmp_path):
    from tests.helpers import png_pixels, screenshot

    _, out, proc, _ = first_run
    assert proc.returncode == 0
    summary = json.loads((out / "summary.json").read_text())
    png = tmp_path / "report.png"
    screenshot(out / "report.html", png, width=1200,
               height=700 + 170 * len(summary["tasks"]) + 60 * len(summary["phones"]))
    pixels = png_pixels(png)

    def near(rgb, p, tol=40):
        return all(abs(a - b) < tol for a, b in zip(rgb, p, strict=True))

    curve = sum(1 for p in pixels if near((0x1F, 0x77, 0xB4), p))  # tuning curves' stroke
    bars = sum(1 for p in pixels if p == (0xFF, 0x7F, 0x0E))  # latency and share bars
    tuned = sum(1 for t in summary["tasks"] if t["best_us"] is not None)
    assert curve >= 100 * min(tuned, 3), curve  # the plots were drawn, not just the text
    assert bars >= 500, bars
    from farm.pipeline.timeline import PALETTE

    task_colours = {tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in PALETTE}
    timeline = sum(1 for p in pixels if p in task_colours)  # the phones' batches, by task
    assert timeline >= 14 * 4 * len(summary["phones"]), timeline


def test_a_service_of_the_embedded_farm_that_dies_is_started_again(first_run):
    """farm/local/services.py: before, the job ended with "phone-cpu-local-1: exited
    unexpectedly" (seen when a candidate's segfault took a phone down with it)."""
    home, out, proc, _ = first_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    for victim in VICTIMS:  # a confined phone's PID is unshare's or its command's (sh: 137)
        assert re.search(rf"{victim} exited \(code (-9|137)\), starting it again",
                         proc.stderr), proc.stderr[-3000:]
    # the first job's farm lists it twice (another test's job on this home lists its own)
    lists = [f.read_text().split() for f in (home / "logs").glob("*/pids*")]
    assert any(names.count("phone-cpu-local-1") == 2 for names in lists), lists
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["phones"]) == 2, summary["phones"]  # it came back on its own address


def test_status_from_another_terminal_while_the_job_runs(first_run):
    *_, status = first_run
    assert status is not None, "farm status never showed the running job"
    job = status[0]
    assert job["device_key"] == "cpu-local" and job["status"]["state"] == "running"
    assert all(t["state"] in ("queued", "waiting", "tuning", "done", "exhausted")
               for t in job["tasks"])
    assert job["trials_left"] >= 0 and job["trials_per_min"] >= 0
    assert job["eta_s"] is None or job["eta_s"] >= 0


def test_embedded_farm_leaves_no_process_behind(first_run):
    home, _, proc, _ = first_run
    pids = started_pids(home)
    names = {name for _, name in pids}
    assert {"redis", "tracker", "worker"} <= names and sum(n.startswith("phone") for n in names) == 2
    assert [p for p in pids if alive(p[0])] == []


def test_resubmit_measures_nothing(first_run, example_models: Path, tmp_path: Path):
    home, first_out, first, _ = first_run
    assert first.returncode == 0
    out = tmp_path / "again"
    proc = run_farm(["submit", str(example_models / "resnet.pt2"), "--trials-per-task", "4",
                     "--out", str(out)], home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert all(t["trials_measured"] == 0 for t in summary["tasks"])
    assert all(t["trials_from_store"] >= 4 for t in summary["tasks"])
    before = {t["workload_key"]: t["best_us"] for t in
              json.loads((first_out / "summary.json").read_text())["tasks"]}
    assert {t["workload_key"]: t["best_us"] for t in summary["tasks"]} == before
    assert summary["numerics_ok"] is True
    # the two runs side by side: the same tasks, the same bests (ratio 1.00), other jobs
    side = run_farm(["report", str(out), "--against", str(first_out)], home)
    assert side.returncode == 0, side.stderr[-3000:]
    page = (out / "report.html").read_text()
    first_job = json.loads((first_out / "summary.json").read_text())["job_id"]
    assert f"Against job {first_job}" in page
    assert page.count("<td>1.00</td>") >= sum(1 for us in before.values() if us)


def test_records_past_the_hot_ones_are_archived_and_exported(first_run, tmp_path: Path):
    """With 2 whole records per workload in Redis (the job above), every other record left
    for the archive ($FARM_HOME/archive): the job still finished, its resubmit still measured
    nothing (test_resubmit_measures_nothing), and export --all gives every record back."""
    home, _, first, _ = first_run
    assert first.returncode == 0
    stats = run_farm(["cache", "stats"], home)
    assert stats.returncode == 0, stats.stderr[-3000:]
    counts = json.loads(stats.stdout)
    assert counts["trials"] > counts["whole_in_redis"] + counts["workloads"]
    out = tmp_path / "every"
    proc = run_farm(["cache", "export", str(out), "--all"], home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = (out / "database_tuning_record.json").read_text().splitlines()
    assert len(rows) == counts["trials"], proc.stdout
    assert list((home / "archive").rglob("*.jsonl.zst")), "nothing reached the archive"


def plain_tvm_build(best: Path, apply_log: bool = True):
    """best/ applied with nothing but TVM, as README shows ("Output"); or its module built
    with TVM's default schedules (`apply_log` False)."""
    import contextlib

    import tvm
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    mod = tvm.ir.load_json((best / "module.json").read_text())
    target = tvm.target.Target(json.loads((best / "target.json").read_text()))
    database = ms.database.JSONDatabase(work_dir=str(best))
    with target, database if apply_log else contextlib.nullcontext(), \
            tvm.transform.PassContext(opt_level=3):
        if apply_log:
            mod = relax.transform.MetaScheduleApplyDatabase()(mod)
        return relax.build(mod, target=target)


def test_best_applies_with_plain_tvm_as_fast_as_model_so(first_run, example_models: Path,
                                                         monkeypatch):
    """best/ carries the module its records apply to: `farm.prepare` makes the same module
    from the model file, plain TVM builds it with the log, and that build matches torch and
    runs as fast as model.so, timed side by side on this machine (the embedded farm's phones
    are its CPU)."""
    import numpy as np
    import torch
    import tvm
    from tvm import relax

    import farm

    home, out, first, _ = first_run
    assert first.returncode == 0
    monkeypatch.setenv("FARM_HOME", str(home))
    monkeypatch.delenv("FARM_BROKER_URL", raising=False)
    mod = tvm.ir.load_json((out / "best" / "module.json").read_text())
    tvm.ir.assert_structural_equal(farm.prepare(example_models / "resnet.pt2"), mod)
    dev = tvm.cpu(0)
    vms = {"plain": relax.VirtualMachine(plain_tvm_build(out / "best"), dev),
           "model.so": relax.VirtualMachine(tvm.runtime.load_module(str(out / "model.so")),
                                            dev)}
    x = torch.randn(1, 3, 32, 32)
    want = torch.export.load(example_models / "resnet.pt2").module()(x).detach().numpy()
    for name, vm in vms.items():
        got = vm["main"](tvm.runtime.tensor(x.numpy(), dev))
        got = (got if isinstance(got, tvm.runtime.Tensor) else got[0]).numpy()
        assert np.allclose(got, want, rtol=1e-4, atol=1e-4), (name, np.abs(got - want).max())
    untuned = relax.VirtualMachine(plain_tvm_build(out / "best", apply_log=False), dev)
    times: dict[str, list[float]] = {"plain": [], "model.so": [], "untuned": []}
    arg = tvm.runtime.tensor(x.numpy(), dev)
    for _ in range(5):  # alternating: the machine is noisy
        for name, vm in {**vms, "untuned": untuned}.items():
            timer = vm.time_evaluator("main", dev, number=20, repeat=3, min_repeat_ms=30)
            times[name].append(min(timer(arg).results))
    best = {name: min(ts) for name, ts in times.items()}
    assert best["plain"] <= 1.2 * best["model.so"], best
    assert best["plain"] < best["untuned"], best  # the log was applied, not TVM's defaults

