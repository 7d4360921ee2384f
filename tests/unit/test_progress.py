"""farm status: per-task bars, the measured trial rate and an ETA from it; drawn with rich to
the terminal's width, redrawn in place on a terminal, plain lines elsewhere, a cell updated in
place in a notebook."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
import textwrap
import time
import types

import pytest
from rich.console import Console

from farm.client.progress import LiveView, job_view, render, watch
from farm.core.messages import JobSpec
from farm.store import RecordStore, StoredRecord, TaskState, open_store

LONG = "fused_conv2d_add_relu_with_a_name_longer_than_any_fixed_width_cut"


def a_job(store: RecordStore) -> JobSpec:
    job = JobSpec(job_id="j", model="models/a_model_with_a_long_name.pt2", device_key="pixel7",
                  target={}, trials_per_task=8, round_trials=4, workload_keys=["a", "b"],
                  task_names={"a": LONG, "b": "reshape"}, weights={"a": 1, "b": 1})
    store.put_job(job)
    store.set_job_status("j", state="running", started_at="1000")
    store.set_task_state("j", "b", TaskState(state="exhausted", message="one schedule"))
    return job


def measure(store: RecordStore, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        store.add_record(StoredRecord(workload_key="a", candidate=f"c{i}", record=[],
                                      run_us=10.0 + i, job_id="j"))
    store.set_task_state("j", "a", TaskState(
        state="tuning", host="farm@h1", best_us=10.0,
        message=f"round 1: {start + n}/8 trials, and a message long enough to be cut",
        failures={"runtime": 1}, errors={"runtime": "a phone's error as long as it likes"}))


def test_eta_comes_from_the_measured_rate():
    store = open_store("memory://")
    job = a_job(store)
    measure(store, 4)
    view = job_view(store, job, now=1120.0)  # 4 trials in 2 minutes
    assert view["trials_measured"] == 4 and view["trials_per_min"] == 2.0
    assert view["trials_left"] == 4 and view["eta_s"] == 120.0
    text = render(view, width=160)
    assert "ETA 2m00s" in text and "tuning on farm@h1" in text
    assert "[##########..........]     4/8" in text
    assert view["measurements"] == {"measurements": 4, "new": 4, "duplicates": 0, "device_lost": 0}
    assert "phone measurements: 4 (4 new records, 0 measured twice, 0 device lost)" in text
    assert "runtime x1: a phone's error as long as it likes" in text
    assert view["tasks"][0]["counts"]["new"] == 4
    store.set_task_state("j", "a", TaskState(state="done"))
    assert job_view(store, job, now=1200.0)["eta_s"] is None  # finished: no ETA


def test_status_shows_the_host_cpu_of_the_rounds_per_part():
    """The CPU account of the rounds so far (workers/round/account.py), from the task states
    the rounds' results wrote: on phone hosts and helper hosts, per part, per trial."""
    from dataclasses import replace

    store = open_store("memory://")
    job = a_job(store)
    measure(store, 4)
    state = store.task_states("j")["a"]
    store.set_task_state("j", "a", replace(state, helper_cpu={"search": 0.8}, cpu={
        "search": 1.0, "build": 2.5, "phones": 0.3, "other": 0.2}))
    view = job_view(store, job, now=1120.0)
    assert view["cpu"]["total_s"] == 4.8 and view["cpu"]["per_trial_s"] == 1.2, view["cpu"]
    assert view["cpu"]["helpers_s"] == {"search": 0.8}
    text = render(view, width=160)
    assert ("host CPU 4.8 s, 1.20 s a trial (0.8 s on helper hosts): build 2.5, search 1.8, "
            "phones 0.3, other 0.2") in text, text


@pytest.mark.parametrize("width", [40, 60, 80, 120])
def test_every_line_fits_the_terminal(width):
    store = open_store("memory://")
    job = a_job(store)
    measure(store, 4)
    text = render(job_view(store, job, now=1120.0), width=width)
    assert max(len(line) for line in text.split("\n")) <= width, text
    assert "\x1b" not in text
    assert ("[#" in text) == (width >= 72)  # the bars go first when it narrows
    assert "ETA 2m00s" in text and "…" in text  # the totals wrap, the long name is cut


class Screen:
    """A terminal's screen, as much of one as rich's Live writes to: text, CR, LF, cursor up,
    erase line, cursor shown or hidden, colours. Any other escape code fails the test."""

    CODE = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")

    def __init__(self, width: int) -> None:
        self.width, self.lines, self.row, self.col = width, [""], 0, 0

    def feed(self, data: str) -> Screen:
        i = 0
        while i < len(data):
            m = self.CODE.match(data, i)
            if m:
                self._code(*m.groups())
                i = m.end()
                continue
            ch = data[i]
            i += 1
            if ch == "\r":
                self.col = 0
            elif ch == "\n":  # a new line (a terminal's driver adds the CR: onlcr)
                self.row, self.col = self.row + 1, 0
                self.lines += [""] * (self.row + 1 - len(self.lines))
            else:
                assert self.col < self.width, f"a line longer than {self.width} columns"
                line = self.lines[self.row].ljust(self.col)
                self.lines[self.row] = line[:self.col] + ch + line[self.col + 1:]
                self.col += 1
        return self

    def _code(self, arg: str, op: str) -> None:
        if op == "A":
            self.row = max(0, self.row - int(arg or 1))
        elif op == "K" and arg == "2":
            self.lines[self.row] = ""
        elif not (op == "m" or arg in ("?25", "?25l", "?25h") and op in "lh"):
            raise AssertionError(f"escape code {arg}{op} not understood")

    def text(self) -> str:
        return "\n".join(line.rstrip() for line in self.lines).strip("\n")


def test_a_terminal_sees_one_frame_replaced_not_appended():
    store = open_store("memory://")
    job = a_job(store)
    out = io.StringIO()
    console = Console(file=out, width=60, height=40, force_terminal=True, color_system="standard")
    with LiveView(console) as view:
        for n in (1, 2, 3):
            measure(store, 1, start=n - 1)
            view(store, job)
            assert view.live is not None
    raw = out.getvalue()
    assert "\x1b[" in raw  # drawn for a terminal: colours and cursor moves
    screen = Screen(60).feed(raw).text()
    last = render(job_view(store, job), width=60)
    assert _without_clock(screen) == _without_clock(last)  # the last frame only, nothing stale
    assert screen.count("job j ") == 1 and "3/8" in screen and "1/8" not in screen


def _without_clock(text: str) -> str:
    return re.sub(r"(elapsed|ETA|at) [0-9.hms/min-]+", r"\1 -", text)


def test_a_pipe_gets_plain_lines_and_a_frame_only_when_something_changed():
    store = open_store("memory://")
    job = a_job(store)
    out = io.StringIO()
    view = LiveView(Console(file=out, width=60))  # a file: no terminal
    measure(store, 1)
    view.show([job_view(store, job, now=1060.0)])
    view.show([job_view(store, job, now=1120.0)])  # the clock alone: not printed again
    measure(store, 1, start=1)
    view(store, job)
    view.close()
    text = out.getvalue()
    assert "\x1b" not in text
    assert text.count("job j ") == 2 and "1/8" in text and "2/8" in text
    assert max(len(line) for line in text.split("\n")) <= 60


def test_a_pty_of_60_columns_gets_a_live_view_within_60_columns(tmp_path):
    """The real thing: stderr a terminal 60 columns wide (COLUMNS=60), the default console."""
    script = tmp_path / "live.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{os.getcwd()!r}]
        from tests.unit.test_progress import a_job, measure
        from farm.client.progress import LiveView
        from farm.store import open_store
        store = open_store("memory://")
        job = a_job(store)
        with LiveView() as view:
            for n in (1, 2, 3):
                measure(store, 1, start=n - 1)
                view(store, job)
    """))
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "60", "LINES": "40", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen([sys.executable, str(script)], stdin=follower, stdout=follower,
                            stderr=follower, env=env)
    os.close(follower)
    chunks = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=60) == 0, b"".join(chunks).decode(errors="replace")
    raw = b"".join(chunks).decode()
    assert "\x1b[1A" in raw  # drawn in place: the cursor went up over the last frame
    screen = Screen(60).feed(raw).text()  # a line over 60 columns fails here
    assert screen.count("job j ") == 1 and "3/8" in screen


def test_a_notebook_cell_is_updated_in_place(monkeypatch):
    shown: list[tuple[str, dict]] = []

    class Handle:
        def update(self, bundle: dict, raw: bool = False) -> None:
            shown.append(("update", bundle))

    def display(bundle: dict, raw: bool = False, display_id: bool = False) -> Handle:
        assert raw and display_id
        shown.append(("display", bundle))
        return Handle()

    ipython = types.ModuleType("IPython")
    ipython.display = types.SimpleNamespace(display=display)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setitem(sys.modules, "IPython.display", ipython.display)
    store = open_store("memory://")
    job = a_job(store)
    view = LiveView(Console(force_jupyter=True, file=io.StringIO()))
    for n in (1, 2):
        measure(store, 1, start=n - 1)
        view(store, job)
    assert [what for what, _ in shown] == ["display", "update"]  # one cell, drawn again
    html, plain = shown[-1][1]["text/html"], shown[-1][1]["text/plain"]
    assert LONG[:20] in html and "2/8" in html and "<pre" in html
    assert "2/8" in plain and "\x1b" not in plain


def test_watch_stops_when_the_jobs_are_finished():
    store = open_store("memory://")
    job = a_job(store)
    measure(store, 2)
    store.set_task_state("j", "a", TaskState(state="done", best_us=10.0))
    out = io.StringIO()
    watch(store, [job.job_id], interval_s=0.01, console=Console(file=out, width=80))
    assert out.getvalue().count("job j ") == 1 and "\x1b" not in out.getvalue()


def test_the_wait_closes_its_view_however_it_ends():
    """farm/pipeline/wait.py: the live view gives the terminal back (the cursor, stdout) when
    the job ends and when the wait gives up."""
    from farm.core.errors import TuneError
    from farm.pipeline.wait import wait_for_job

    store = open_store("memory://")
    job = a_job(store)
    measure(store, 1)
    farm = types.SimpleNamespace(check_alive=lambda: None, store=store)
    for ends in ("timeout", "done"):
        out = io.StringIO()
        view = LiveView(Console(file=out, width=60, force_terminal=True))
        if ends == "timeout":  # a task still tuning: drawn once, then the deadline passed
            with pytest.raises(TuneError, match="not finished after"):
                wait_for_job(farm, job, print, timeout_s=0, view=view)  # type: ignore[arg-type]
        else:
            store.set_task_state("j", "a", TaskState(state="done"))
            assert wait_for_job(farm, job, print, timeout_s=5, view=view)  # type: ignore[arg-type]
        assert "job j\x1b[0m (" in out.getvalue()  # drawn
        assert view.live is None and out.getvalue().endswith("\x1b[?25h")  # the cursor is back
