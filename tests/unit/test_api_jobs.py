"""A job from Python, attached by id or submitted here: what `Job.wait` may replace, and the
views it and `Job.resume` wait with."""

from __future__ import annotations

from pathlib import Path

import pytest

import farm
from farm.client import api
from farm.core.messages import JobSpec
from farm.pipeline.preflight import OUT_MARKER


class Followed:
    """Stands in for the pipeline's `follow` (`farm wait`): keeps what it was asked."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, job_id, config, say, out=None, force=False, timeout_s=None,
                 allow_pickle=False, view=None) -> dict:
        self.calls.append({"job_id": job_id, "out": out, "force": force, "view": view})
        return {"job_id": job_id, "state": "finalized", "best_records": 0}


@pytest.fixture
def followed(monkeypatch) -> Followed:
    fake = Followed()
    monkeypatch.setattr("farm.pipeline.job.follow", fake)
    return fake


@pytest.fixture
def lab(clean_redis, tmp_path, monkeypatch) -> farm.Farm:
    monkeypatch.setenv("FARM_HOME", str(tmp_path / "home"))
    return farm.Farm(broker=clean_redis)


def a_job_out(lab: farm.Farm, out: Path) -> None:
    """A job in the store whose options name `out` as its results folder."""
    with lab.store() as store:
        store.put_job(JobSpec(job_id="j1", model="m.pt2", device_key="cpu-local", target={},
                              trials_per_task=1, round_trials=1, workload_keys=[],
                              task_names={}, weights={},
                              options={"model": "m.pt2", "out": str(out)}))


def test_an_attached_job_never_replaces_a_folder_the_store_names(lab, followed, tmp_path):
    """`Farm(broker=...).job(ID).wait()`: the store (others can write it) names the results
    folder; a folder that is not the farm's result is not replaced (as `farm wait`)."""
    theirs = tmp_path / "thesis"
    theirs.mkdir()
    (theirs / "chapter1.tex").write_text("years of work")
    a_job_out(lab, theirs)
    lab.job("j1").wait()
    assert followed.calls[-1]["out"] == theirs and followed.calls[-1]["force"] is False


@pytest.mark.parametrize("content", [None, "", OUT_MARKER])
def test_an_attached_job_replaces_a_result_of_the_farm(lab, followed, tmp_path, content):
    """Missing, empty, or a results folder the farm wrote: replaced, as `farm resume` does."""
    out = tmp_path / "run"
    if content is not None:
        out.mkdir()
        if content:
            (out / content).write_text("")
    a_job_out(lab, out)
    lab.job("j1").wait()
    assert followed.calls[-1]["force"] is True


def test_a_job_submitted_here_replaces_its_out(lab, followed, tmp_path, monkeypatch):
    """The out this process's `submit` was given is the caller's own: `wait` may replace it."""
    monkeypatch.setattr("farm.pipeline.job.submit",
                        lambda opts, config, say=print, resume=None, view=None:
                        {"job_id": "j2", "state": "submitted"})
    out = tmp_path / "mine"
    out.mkdir()
    (out / "partial").write_text("")
    job = lab.submit("m.pt2", out=out, wait=False)
    job.wait()
    assert followed.calls[-1]["force"] is True
    api.Job(lab, "j2", out).wait()  # the same job, as `Farm.job` attaches it
    assert followed.calls[-1]["force"] is False


def test_a_job_resumed_here_into_an_out_of_its_own_replaces_it(lab, followed, tmp_path,
                                                               monkeypatch):
    """`job.resume(out=X, wait=False)` names X in this process (as `farm resume --out X`):
    the `wait` after replaces it; a resume into the job's own out does not name one."""
    monkeypatch.setattr("farm.client.jobs.resume",
                        lambda job_id, config, say, out=None, **kw:
                        {"job_id": job_id, "state": "submitted",
                         "out": str(out or tmp_path / "theirs")})
    for name in ("theirs", "mine"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "notes.txt").write_text("")
    job = api.Job(lab, "j1", tmp_path / "theirs")
    job.resume(wait=False).wait()
    assert followed.calls[-1]["force"] is False
    job.resume(out=tmp_path / "mine", wait=False).wait()
    assert followed.calls[-1] == {"job_id": "j1", "out": tmp_path / "mine", "force": True,
                                  "view": None}


@pytest.fixture
def live(monkeypatch) -> list:
    """The live views made (farm/client/progress.py: live_view, what `progress=True` draws)."""
    import io

    from rich.console import Console

    from farm.client import progress

    made: list = []

    def live_view():
        made.append(progress.LiveView(Console(file=io.StringIO(), width=60)))
        return made[-1]

    monkeypatch.setattr(progress, "live_view", live_view)
    return made


def test_wait_and_resume_draw_the_live_view_as_submit_does(lab, followed, live, monkeypatch,
                                                           tmp_path):
    views = []
    monkeypatch.setattr("farm.client.jobs.resume",
                        lambda job_id, config, say, view=None, **kw:
                        views.append(view) or {"job_id": job_id, "state": "submitted",
                                               "out": str(tmp_path / "run")})
    job = api.Job(lab, "j1", tmp_path / "run")
    job.resume(wait=False, progress=True)
    assert views == [live[0]]
    job.wait(progress=True)
    assert followed.calls[-1]["view"] is live[1]
    job.summary = None
    job.wait()
    assert followed.calls[-1]["view"] is None and len(live) == 2


def test_farm_wait_draws_the_live_view_as_submit_and_resume_do(followed, monkeypatch,
                                                               tmp_path, capsys):
    from farm.client import cli, cmd_job

    view = object()
    monkeypatch.setattr(cmd_job, "_live_view", lambda: view)
    monkeypatch.setenv("FARM_HOME", str(tmp_path / "home"))
    assert cli.main(["wait", "j1", "--broker", "redis://127.0.0.1:1/0", "--json"]) == 0
    assert followed.calls[-1]["view"] is view
