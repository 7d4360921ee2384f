"""`on_progress=`: a waiting job's progress as an object (farm.Progress), at each change, with
the line an `on_line=` callback gets beside it."""

from __future__ import annotations

import dataclasses

import pytest

import farm
from farm.client import api
from farm.client.jobs import ProgressFeed, progress_now, recent
from farm.core.messages import JobSpec
from farm.store import RecordStore, StoredRecord, TaskState, open_store


def a_job(store: RecordStore) -> JobSpec:
    job = JobSpec(job_id="j", model="m.pt2", device_key="cpu-local", target={},
                  trials_per_task=8, round_trials=4, workload_keys=["a", "b"],
                  task_names={"a": "dense", "b": "reshape"}, weights={"a": 1, "b": 1})
    store.put_job(job)
    store.set_job_status("j", state="running", started_at="1000")
    store.set_task_state("j", "b", TaskState(state="exhausted", message="one schedule"))
    return job


def measure(store: RecordStore, n: int, best_us: float) -> None:
    for i in range(n):
        store.add_record(StoredRecord(workload_key="a", candidate=f"c{best_us}-{i}", record=[],
                                      run_us=best_us + i, job_id="j"))
    store.set_task_state("j", "a", TaskState(state="tuning", best_us=best_us))


def test_each_change_reaches_both_callbacks_once():
    store = open_store("memory://")
    job = a_job(store)
    lines: list[str] = []
    seen: list[farm.Progress] = []
    feed = ProgressFeed(lines.append, seen.append)
    measure(store, 2, best_us=20.0)
    feed(store, job)
    feed(store, job)  # a poll that saw nothing new
    assert len(lines) == len(seen) == 1
    measure(store, 3, best_us=12.5)
    feed(store, job)
    assert len(lines) == len(seen) == 2
    first, now = seen
    assert now.line == lines[-1] and "5 trials measured" in now.line
    assert (first.trials_done, now.trials_done) == (2, 5)
    assert now.trials_total == 8 and now.job_id == "j" and now.state == "running"
    assert now.best_us == {"dense": 12.5, "reshape": None}
    assert [(t.name, t.state, t.trials, t.goal) for t in now.tasks] == [
        ("dense", "tuning", 5, 8), ("reshape", "exhausted", 0, 0)]
    assert now.tasks_finished == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        now.state = "done"  # type: ignore[misc]
    assert progress_now(store, job) == now  # what Job.progress() reads


def test_lines_alone_need_no_feed():
    assert api._feed(print, None) is None  # the wait reports its lines itself


def test_the_latest_jobs_are_listed_as_farm_status_lists_them():
    store = open_store("memory://")
    for i in range(12):
        store.put_job(JobSpec(job_id=f"j{i:02}", model="m", device_key="k", target={},
                              trials_per_task=1, round_trials=1, workload_keys=[],
                              task_names={}, weights={}))
    assert recent(store) == [f"j{i:02}" for i in range(2, 12)]
    assert recent(store, 3) == ["j09", "j10", "j11"] and recent(store, 0) == []


def test_progress_true_draws_the_live_view_beside_the_callbacks(monkeypatch):
    """`Farm.submit(progress=True)`: the job's live view (plain lines where stderr is no
    terminal), beside an `on_progress` callback; the wait closes both."""
    import io

    from rich.console import Console

    from farm.client import progress

    out = io.StringIO()
    monkeypatch.setattr(progress, "live_view",
                        lambda: progress.LiveView(Console(file=out, width=60)))
    store = open_store("memory://")
    job = a_job(store)
    measure(store, 2, best_us=20.0)
    seen: list[farm.Progress] = []
    view = api._feed(None, seen.append, progress=True)
    view(store, job)
    view.close()
    assert len(seen) == 1 and seen[0].trials_done == 2
    drawn = out.getvalue()
    assert "dense" in drawn and "\x1b[" not in drawn, drawn  # plain: a file, not a terminal
    assert all(len(line) <= 60 for line in drawn.splitlines()), drawn
    alone = api._feed(None, None, progress=True)
    assert isinstance(alone, progress.LiveView)


def test_progress_true_keeps_the_progress_lines(monkeypatch):
    """`progress=True` with `on_line=` and no `on_progress`: the live view replaces the wait's
    own lines, so the view must hand them to `on_line` itself."""
    import io

    from rich.console import Console

    from farm.client import progress

    monkeypatch.setattr(progress, "live_view",
                        lambda: progress.LiveView(Console(file=io.StringIO(), width=60)))
    store = open_store("memory://")
    job = a_job(store)
    measure(store, 2, best_us=20.0)
    lines: list[str] = []
    view = api._feed(lines.append, None, progress=True)
    view(store, job)
    measure(store, 1, best_us=10.0)
    view(store, job)
    view.close()
    assert len(lines) == 2 and "3 trials measured" in lines[-1], lines


def test_farm_status_piped_is_as_wide_with_and_without_watch(monkeypatch, capsys):
    """`farm status | cat` and `farm status --watch | cat`: the same plain lines, as wide as
    `render` draws where the output is no terminal (not rich's 80 columns of a file)."""
    import contextlib
    import os
    import shutil

    from farm.client import cli, cmd_job
    from farm.client.progress import PLAIN_WIDTH

    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(shutil, "get_terminal_size",  # stdout is a pipe
                        lambda fallback=(80, 24): os.terminal_size(fallback))
    store = open_store("memory://")
    name = "fused_conv2d_add_relu_" * 4
    store.put_job(JobSpec(job_id="j", model="m.pt2", device_key="cpu-local", target={},
                          trials_per_task=8, round_trials=4, workload_keys=["a"],
                          task_names={"a": name}, weights={"a": 1}))
    store.set_job_status("j", state="running", started_at="1000")
    store.set_task_state("j", "a", TaskState(state="done", best_us=12.5))
    monkeypatch.setattr(cmd_job, "store_of", lambda args: contextlib.nullcontext(store))
    shown = []
    for flags in ([], ["--watch"]):
        args = cli.build_parser().parse_args(["status", "j", *flags])
        assert cmd_job.cmd_status(args) == 0
        lines = capsys.readouterr().out.rstrip("\n").split("\n")
        shown.append([line for line in lines if "elapsed" not in line])  # the clock moved
    plain, watched = shown
    assert watched == plain and any(name[:40] in line for line in plain), shown
    assert 80 < max(len(line) for line in plain) <= PLAIN_WIDTH


def test_the_progress_line_callback_answers_to_its_old_name_too():
    """`on_line=` is the progress-line callback; `report=`, its name before, still works; both
    at once is refused (which one would be meant?)."""
    from farm.core.errors import UsageError

    assert api._one(print, None) is print and api._one(None, print) is print
    assert api._one(None, None) is None
    with pytest.raises(UsageError, match="pass one"):
        api._one(print, print)
