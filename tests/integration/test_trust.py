"""Trust, for real: a poisoned log imported into the store never becomes a job's choice (the
job's first rounds measure the imported candidates on its phones); the embedded farm keeps
its secrets off command lines and its Redis behind a password."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.faults.conftest import tiny_model
from tests.helpers import run_farm

pytestmark = pytest.mark.integration


def poison(log: Path, out: Path) -> None:
    """Copy a JSONDatabase with every record claiming 1e-9 s (0.001 us)."""
    out.mkdir()
    (out / "database_workload.json").write_text((log / "database_workload.json").read_text())
    rows = []
    for line in (log / "database_tuning_record.json").read_text().splitlines():
        index, record = json.loads(line)
        record[1] = [1e-9]
        rows.append(json.dumps([index, record]))
    (out / "database_tuning_record.json").write_text("\n".join(rows) + "\n")


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory: pytest.TempPathFactory):
    """A job on home A; its best log poisoned and imported into home B; the same model
    submitted on B while the test watches B's processes."""
    root = tmp_path_factory.mktemp("trust")
    model = tiny_model(root / "mlp.pt2", width=24, layers=2)
    first = run_farm(["submit", str(model), "--trials-per-task", "4", "--round-trials", "4",
                      "--out", str(root / "a-out")], root / "a", timeout_s=900)
    assert first.returncode == 0, first.stderr[-3000:]
    assert run_farm(["cache", "export", str(root / "log")], root / "a").returncode == 0
    poison(root / "log", root / "poisoned")
    imported = run_farm(["cache", "import", str(root / "poisoned")], root / "b")
    assert imported.returncode == 0, imported.stderr
    ls_before = json.loads(run_farm(["cache", "ls", "--json"], root / "b").stdout)
    cands = []  # the imported candidates, as the store filed them
    for row in ls_before:
        shown = json.loads(run_farm(["cache", "show", row["workload_key"]], root / "b").stdout)
        cands += [r["candidate"] for r in shown["top"] if not r["verified"]]

    env = {**os.environ, "FARM_HOME": str(root / "b")}
    env.pop("FARM_BROKER_URL", None)
    job = subprocess.Popen([sys.executable, "-m", "farm", "submit", str(model),
                            "--trials-per-task", "4", "--round-trials", "4", "--out",
                            str(root / "b-out")], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    seen: dict = {"cmdlines": [], "url": None, "noauth": None}
    deadline = time.monotonic() + 600
    while job.poll() is None and time.monotonic() < deadline and seen["noauth"] is None:
        running = root / "b" / "running.json"
        try:
            seen["url"] = json.loads(running.read_text())["broker_url"]
            seen["running_mode"] = stat.S_IMODE(running.stat().st_mode)
        except (OSError, ValueError, KeyError):
            time.sleep(0.5)
            continue
        kids = psutil.Process(job.pid).children(recursive=True)
        if not any("-m farm " in " ".join(k.cmdline()) for k in kids if k.is_running()):
            time.sleep(0.5)  # the worker is not up yet
            continue
        for k in kids:
            try:
                seen["cmdlines"].append(" ".join(k.cmdline()))
            except psutil.Error:
                pass
        import redis

        port = int(seen["url"].rsplit(":", 1)[1].split("/")[0])
        try:
            redis.Redis(host="127.0.0.1", port=port, socket_timeout=5).ping()
            seen["noauth"] = "answered"
        except redis.AuthenticationError as e:
            seen["noauth"] = f"refused: {e}"
        except redis.ResponseError as e:
            seen["noauth"] = f"refused: {e}"
    out, err = job.communicate(timeout=900)
    assert job.returncode == 0, err[-3000:]
    return {"root": root, "cands": cands, "ls_before": ls_before, "seen": seen,
            "summary": json.loads((root / "b-out" / "summary.json").read_text())}


def test_a_poisoned_import_is_measured_before_any_job_takes_it(poisoned):
    before = poisoned["ls_before"]
    assert before and all(r["unverified"] >= 1 and r["best_us"] is None and r["trials"] == 0
                          for r in before), before  # imported: never the best, not counted
    summary = poisoned["summary"]
    for task in summary["tasks"]:
        assert task["best_us"] is not None and task["best_us"] > 0.01, task  # not 0.001 us
    home = poisoned["root"] / "b"
    measured = set()
    for row in json.loads(run_farm(["cache", "ls", "--json"], home).stdout):
        assert row["unverified"] == 0, row  # the job's first round measured every import
        shown = json.loads(run_farm(["cache", "show", row["workload_key"]], home).stdout)
        # every record is this job's measurement: of its search ("job"), or a relative's
        # schedule carried over and measured by it ("transfer:<relative>")
        assert all(s == "job" or s.startswith("transfer:") for s in shown["sources"]), shown
        assert sum(shown["sources"].values()) == shown["trials"], shown
        assert shown["jobs"] == [summary["job_id"]], shown
        assert all(r["verified"] for r in shown["top"]), shown
        measured |= {r["candidate"] for r in shown["top"]}
    # each imported candidate is in the store as this job's measurement, with its real time
    assert poisoned["cands"] and set(poisoned["cands"]) <= measured
    assert summary["measurements"]["duplicates"] == 0


def test_the_embedded_farm_keeps_its_secrets(poisoned):
    seen = poisoned["seen"]
    assert seen["url"] and seen["url"].startswith("redis://:"), seen["url"]
    password = seen["url"].split("://:", 1)[1].split("@", 1)[0]
    assert len(password) >= 16
    assert seen["cmdlines"], "no process of the embedded farm was seen"
    assert [c for c in seen["cmdlines"] if password in c] == []
    assert seen["noauth"] and seen["noauth"].startswith("refused"), seen["noauth"]
    assert seen["running_mode"] == 0o600
    home = poisoned["root"] / "b"
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "redis").stat().st_mode) == 0o700


def test_cache_verify_measures_the_bests_again(poisoned):
    """`farm cache verify` builds every stored best and times it again on the phones."""
    home = poisoned["root"] / "b"
    proc = run_farm(["cache", "verify", "--json"], home, timeout_s=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)
    bests = {t["workload_key"] for t in poisoned["summary"]["tasks"] if t["best_us"]}
    assert {r["workload_key"] for r in rows} == bests
    for r in rows:
        assert r["error"] == "" and r["measured_us"] > 0, r
        # the same emulated phones: today's time is of the stored one's order
        assert -0.9 < r["drift"] < 9, r
