"""The Python API (farm.Farm) against the embedded farm, as a notebook uses it: an nn.Module
with example inputs, no file written by the caller; the cache read back through the API."""

from __future__ import annotations

import json

import pytest

import farm
from tests.helpers import alive, started_pids

pytestmark = pytest.mark.integration


def test_an_nn_module_is_tuned_from_python_on_the_embedded_farm(tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("FARM_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FARM_BROKER_URL", raising=False)
    torch.manual_seed(21)
    net = torch.nn.Sequential(torch.nn.Linear(21, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    lab = farm.Farm(settings={"round_trials": 2})
    assert lab.embedded
    seen: list[str] = []
    progress: list[farm.Progress] = []
    job = lab.submit(net, example_inputs=(torch.randn(2, 21),), trials_per_task=2,
                     out=tmp_path / "out", on_line=seen.append, on_progress=progress.append)
    summary = job.summary
    assert summary is not None and summary["job_id"] == job.job_id
    assert summary["numerics_ok"] and summary["inputs"] == [[2, 21]]
    assert summary == json.loads((tmp_path / "out" / "summary.json").read_text())
    assert all(t["trials_measured"] + t["trials_from_store"] >= 1 for t in summary["tasks"])
    assert any(line.startswith("plan: job ") for line in seen), seen  # progress reached us
    # while the workers measured: an object at each change, its line also given as text
    assert progress and all(p.job_id == job.job_id for p in progress)
    assert [p.line for p in progress] == [line for line in seen if " tasks finished " in line]
    last = progress[-1]
    assert last.tasks_finished == len(last.tasks) == len(summary["tasks"])
    assert last.trials_done == sum(t["trials_measured"] for t in summary["tasks"])
    assert set(last.best_us) == {t["name"] for t in summary["tasks"]}
    assert job.wait() is summary  # a finished embedded job: nothing to wait for
    # the exported module was the job's input, not left behind by it
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.model-")]
    # every process the embedded farm started has ended
    assert started_pids(tmp_path / "home") and not [p for p, _ in started_pids(
        tmp_path / "home") if alive(p)]

    status = job.status()  # read from the store the farm left in FARM_HOME
    assert status["job_id"] == job.job_id
    assert {t["name"] for t in status["tasks"]} == {t["name"] for t in summary["tasks"]}
    listed = {row["workload_key"] for row in lab.cache.ls()}
    assert {t["workload_key"] for t in summary["tasks"]} <= listed
    assert lab.cache.export(tmp_path / "log") == len(summary["tasks"])
    assert (tmp_path / "log" / "database_tuning_record.json").is_file()
    # what `farm cache archive` and `farm cache export --all` do, from Python
    archived = lab.cache.archive()
    assert archived["archive"] == str(tmp_path / "home" / "archive"), archived
    # 2 trials a task stay among the hot records a workload keeps in Redis: nothing to move
    assert (archived["moved"], archived["waiting"], archived["files"]) == (0, 0, 0), archived
    measured = sum(t["trials_measured"] for t in summary["tasks"])
    assert lab.cache.export(tmp_path / "all", all_records=True) >= measured
    assert [row["job_id"] for row in lab.jobs()] == [job.job_id]
    assert lab.job(job.job_id).out == (tmp_path / "out").resolve()


def test_bad_api_input_is_a_farm_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("FARM_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FARM_BROKER_URL", raising=False)
    lab = farm.Farm()
    with pytest.raises(farm.FarmError, match="a .pt2/.pt path or an nn.Module, not a object"):
        lab.submit(object(), out=tmp_path / "out")
    import torch

    with pytest.raises(farm.FarmError, match="needs example_inputs"):
        lab.submit(torch.nn.ReLU(), out=tmp_path / "out")
    with pytest.raises(farm.FarmError, match="no such file"):
        lab.submit(tmp_path / "missing.pt2", out=tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "home").exists()
