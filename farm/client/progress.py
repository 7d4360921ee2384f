"""What `farm status` and a waiting `farm submit` show: per job, per task a bar, the best
latency and the state; totals, the measured trial rate and an ETA. Built from the store only,
so any terminal on the farm (not just the submitting one) sees the same.

Drawn with rich to the width of the terminal (narrow: the bars go, then the names are cut),
redrawn in place on a terminal (rich's Live), as plain lines where the output is no terminal
(a log, a pipe: no escape codes), and as one output cell updated in place in Jupyter."""

from __future__ import annotations

import io
import shutil
import time
from typing import Literal

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from farm.core.aliases import JsonDict
from farm.core.messages import JobSpec
from farm.pipeline.summary import cpu_line, cpu_section, numerics_hint, phone_section
from farm.store import TaskState
from farm.store.store import COUNTERS, FarmView, total_counts

BAR = 20
PLAIN_WIDTH = 160  # the width of plain lines where the output is no terminal (a log, a pipe)
JUPYTER_WIDTH = 115  # rich's own width for a notebook cell
FINISHED = ("done", "exhausted", "failed")


def job_view(store: FarmView, job: JobSpec, now: float | None = None) -> JsonDict:
    """A job's progress as JSON (what `farm status --json` prints)."""
    now = now or time.time()
    states = store.task_states(job.job_id)
    measured = store.job_measured(job.job_id)
    status = store.job_status(job.job_id)
    counts = store.job_counts(job.job_id)
    tasks, left = [], 0
    for wk in job.workload_keys:
        st = states.get(wk, TaskState(state="queued", message="not dispatched yet"))
        have = store.record_count(wk)
        goal = max(job.trials_per_task, have) if not st.terminal else have
        if not st.terminal:
            left += max(0, job.trials_per_task - have)
        tasks.append({"name": job.task_names.get(wk, wk), "workload_key": wk,
                      "trials_measured": measured.get(wk, 0), "trials_in_store": have,
                      "trials_goal": goal, **st.to_json(),
                      "counts": counts.get(wk, dict.fromkeys(COUNTERS, 0))})
    done = sum(measured.values())
    if job.trials_budget:  # a job budget: what is left of it, not of every task's cap
        left = min(left, max(0, job.trials_budget - done))
    started = float(status.get("started_at") or job.created_at or now)
    elapsed = max(1e-9, now - started)
    rate = done / elapsed * 60 if done else 0.0  # trials per minute, over the job so far
    finished = sum(1 for t in tasks if t["state"] in FINISHED)
    running = status.get("state", "running") == "running" and finished < len(tasks)
    eta = left / rate * 60 if running and rate > 0 else None
    phones = phone_section(store, job, now=now if running else None)
    return {"job_id": job.job_id, "name": job.options.get("name"), "model": job.model, "device_key": job.device_key,
            "store_full": store.full(),
            "priority": job.priority, "run": job.run, "status": status, "tasks": tasks,
            "tasks_finished": finished, "trials_measured": done, "trials_left": left,
            "measurements": total_counts(counts),
            "cpu": cpu_section(states, done),
            "trials_per_min": round(rate, 2), "elapsed_s": round(elapsed, 1),
            "eta_s": None if eta is None else round(eta, 1), **phones}


def _bar(done: int, goal: int, width: int = BAR) -> Text:
    filled = width if goal <= 0 else min(width, round(width * done / goal))
    return Text.assemble("[", ("#" * filled, "green"), ("." * (width - filled), "dim"), "]")


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _state(t: JsonDict) -> Text:
    """A task's state, and under it its message and the first error of each failure class."""
    if t["state"] == "tuning" and t.get("host"):
        text = Text(f"tuning on {t['host']}", style="cyan")
    elif t["state"] == "failed":
        text = Text(f"failed: {t['message']}", style="red")
    else:
        text = Text(t["state"], style="green" if t["state"] in FINISHED else "")
    if t["state"] in ("waiting", "queued", "tuning") and t.get("message"):
        text.append(f"\n{t['message']}", style="dim")
    for cls, words in (t.get("errors") or {}).items():  # the phone's own words, first of each
        text.append(f"\n{cls} x{t['failures'].get(cls, t.get('device_lost', 0))}: {words}",
                    style="yellow")
    return text


def _tasks(view: JsonDict, width: int) -> Table:
    """One row per task, cut to the width: the bar shrinks, then goes, as the terminal
    narrows; then the names and the states' lines are cut (`farm status --json`: whole)."""
    bar = BAR if width >= 100 else 10 if width >= 72 else 0
    rows = [(Text(t["name"]), _bar(t["trials_in_store"], t["trials_goal"], bar),
             Text(f"{t['trials_in_store']}/{t['trials_goal']}"),
             Text(f"{t['best_us']:.1f} us" if t.get("best_us") else "-"), _state(t))
            for t in view["tasks"]]
    trials = max([len("trials"), *(len(r[2]) for r in rows)])
    best = max([len("best"), *(len(r[3]) for r in rows)])
    # what the task's name and its state share: the width less the fixed columns and gaps
    free = width - trials - best - (bar + 3 if bar else 0) - 2 * 3
    name = min(max([len("task"), *(len(r[0]) for r in rows)]), max(8, free * 2 // 5))
    table = Table(box=None, padding=(0, 1), pad_edge=False, header_style="bold")
    table.add_column("task", width=name, no_wrap=True, overflow="ellipsis")
    if bar:
        table.add_column("trials", width=bar + 2, no_wrap=True)
    table.add_column("" if bar else "trials", width=trials, no_wrap=True, justify="right")
    table.add_column("best", width=best, no_wrap=True, justify="right")
    table.add_column("state", width=max(4, free - name), no_wrap=True, overflow="ellipsis")
    for r in rows:
        table.add_row(r[0], *([r[1]] if bar else []), *r[2:])
    return table


def _footer(view: JsonDict) -> list[Text]:
    lines = []
    m = view.get("measurements", {})
    if m.get("measurements"):
        lines.append(Text(f"phone measurements: {m['measurements']} ({m['new']} new records, "
                          f"{m['duplicates']} measured twice, {m['device_lost']} device lost)"))
    cpu = cpu_line(view.get("cpu") or {})
    if cpu:
        lines.append(Text(cpu))
    for p in view.get("phones", []):
        if p["measurements"] or p["device_lost"]:
            lines.append(Text(f"phone {p['phone']} on {p['worker']}: {p['measurements']} "
                              f"measured, busy {p['busy_s']:.0f} s "
                              f"({100 * p['utilization']:.0f} %), mean {p['mean_ms']:.0f} ms, "
                              f"{p['device_lost']} device lost"))
        else:
            lines.append(Text(f"phone {p['phone']} on {p['worker']}: measured nothing"))
    return lines


def frame(view: JsonDict, width: int) -> RenderableType:
    """A job's view for a console `width` columns wide: its head (the totals wrap), a row per
    task, then the phones."""
    st = view["status"].get("state", "running")
    head = Text(no_wrap=True, overflow="ellipsis")
    head.append(f"job {view['job_id']}" + (f" {view['name']}" if view.get("name") else ""),
                style="bold")
    head.append(f" ({view['model']}, {view['device_key']}, {st})")
    totals = Text(f"{view['tasks_finished']}/{len(view['tasks'])} tasks, "
                  f"{view['trials_measured']} trials measured at "
                  f"{view['trials_per_min']:.1f}/min, {view['trials_left']} left, "
                  f"elapsed {_duration(view['elapsed_s'])}, ETA {_duration(view['eta_s'])}")
    parts: list[RenderableType] = [head, totals]
    if view.get("store_full"):
        parts.append(Text(f"the store is full: {view['store_full']}", style="bold red"))
    if st == "failed" and view["status"].get("message"):
        parts.append(Text(view["status"]["message"], style="red"))
    return Group(*parts, _tasks(view, width), *_footer(view))


def _frames(views: list[JsonDict], width: int) -> RenderableType:
    if not views:
        return Text("no jobs on this farm")
    shown: list[RenderableType] = []
    for i, v in enumerate(views):
        shown += [Text("")] if i else []
        shown.append(frame(v, width))
    return Group(*shown)


def plain(renderable: RenderableType, width: int) -> str:
    """A renderable as plain lines of at most `width` columns (no escape codes)."""
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, force_terminal=False,
            force_jupyter=False, highlight=False, emoji=False).print(renderable)
    return "\n".join(line.rstrip() for line in out.getvalue().rstrip("\n").split("\n"))


def render(view: JsonDict, width: int | None = None) -> str:
    """The view as plain lines, as wide as the terminal (`width`: that many columns)."""
    return plain(frame(view, width or _width()), width or _width())


def _width() -> int:
    """$COLUMNS, else the terminal's width (stdout's), else PLAIN_WIDTH (a log, a pipe)."""
    return shutil.get_terminal_size((PLAIN_WIDTH, 24)).columns


Mode = Literal["terminal", "jupyter", "plain"]
# a notebook cell's frame: rich's inline styles in a <pre>, as its own Jupyter output does
CELL = ('<pre style="white-space:pre;overflow-x:auto;line-height:normal;'
        'font-family:Menlo,\'DejaVu Sans Mono\',consolas,\'Courier New\',monospace">'
        '{code}</pre>')


class LiveView:
    """Jobs' views drawn again at every poll: in place on a terminal (rich's Live: the new
    frame replaces the last, cut to the terminal's height), as one output cell updated in
    place in Jupyter, and elsewhere (a log, a pipe) as plain lines: a frame whenever a task's
    state or trial count changed, as wide as the `console` given, else as `farm status`
    prints them (`render`: not rich's 80 columns of a file). On stderr, or on stdout
    (`stdout`: `farm status --watch`) when no `console` is given. Called with the store and a
    job, it is the `view` of farm.pipeline.wait.wait_for_job. `close()` (or leaving a
    `with`) leaves the last frame on screen and gives the cursor back; it can be called
    twice."""

    def __init__(self, console: Console | None = None, *, stdout: bool = False) -> None:
        self.plain_width = None if console is not None else _width()
        self.console = console or Console(stderr=not stdout, highlight=False)
        self.mode: Mode = ("jupyter" if self.console.is_jupyter else
                           "terminal" if self.console.is_terminal
                           and not self.console.is_dumb_terminal else "plain")
        self.live: Live | None = None
        self.cell: object = None  # the notebook's display handle
        self.shown: object = None  # what the last plain frame showed

    def __call__(self, store: FarmView, job: JobSpec) -> None:
        self.show([job_view(store, job)])

    def __enter__(self) -> LiveView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def show(self, views: list[JsonDict]) -> None:
        if self.mode == "jupyter" and self._cell(views):
            return
        if self.mode == "terminal":
            if self.live is None:
                self.live = Live(console=self.console, auto_refresh=False,
                                 vertical_overflow="ellipsis")
                self.live.start()
            self.live.update(_frames(views, self.console.width), refresh=True)
            return
        shown = _changes(views)
        if shown != self.shown:
            self.shown = shown
            width = self.plain_width or self.console.width
            self.console.file.write(plain(_frames(views, width), width) + "\n")
            self.console.file.flush()

    def _cell(self, views: list[JsonDict]) -> bool:
        """Draw the frame in the notebook's output cell; False without IPython."""
        try:
            from IPython.display import display
        except ImportError:
            return False
        rec = Console(record=True, file=io.StringIO(), width=JUPYTER_WIDTH, force_jupyter=False,
                      force_terminal=True, color_system="truecolor", highlight=False)
        rec.print(_frames(views, JUPYTER_WIDTH))
        bundle = {"text/plain": rec.export_text(clear=False),
                  "text/html": rec.export_html(inline_styles=True, code_format=CELL)}
        if self.cell is None:
            self.cell = display(bundle, raw=True, display_id=True)
        else:
            self.cell.update(bundle, raw=True)  # type: ignore[attr-defined]
        return True

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


def _changes(views: list[JsonDict]) -> object:
    """What a plain frame is printed again for: a job's or a task's state, its trials, its
    best (not the clock: elapsed, rate and ETA alone print nothing)."""
    return [(v["status"].get("state"), v["store_full"],
             [(t["state"], t["trials_in_store"], t.get("best_us"), t.get("message"))
              for t in v["tasks"]]) for v in views]


def live_view(console: Console | None = None) -> LiveView:
    """A job's live view for `farm.pipeline.job.submit(view=...)` (the API's `progress=True`):
    on the terminal, in the notebook, or as plain lines, whichever stderr is."""
    return LiveView(console)


def watch(store: FarmView, job_ids: list[str], interval_s: float,
          console: Console | None = None) -> None:
    """`farm status --watch`: the jobs' views, drawn again every `interval_s` (on stdout)
    until none of them runs any more."""
    with LiveView(console, stdout=True) as view:
        while True:
            views = [job_view(store, store.require_job(job_id)) for job_id in job_ids]
            view.show(views)
            if all(v["status"].get("state") != "running"
                   or v["tasks_finished"] == len(v["tasks"]) for v in views):
                return
            time.sleep(interval_s)


def format_table(summary: JsonDict) -> str:
    rows = [("task", "trials", "from store", "best us", "GFLOPS", "default us", "best from",
             "state")]
    for t in summary["tasks"]:
        best = f"{t['best_us']:.1f}" if t["best_us"] is not None else "-"
        gflops = f"{t['gflops']:.3g}" if t.get("gflops") is not None else "-"
        default = f"{t['default_us']:.1f}" if t.get("default_us") is not None else "-"
        rows.append((t["name"][:48], str(t["trials_measured"]), str(t["trials_from_store"]),
                     best, gflops, default, (t.get("best_from") or "-")[:40], t["state"]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lat = summary["latency_us"]
    lines.append("")
    foreign = "target" in summary and "mtriple" in summary["target"]
    torch_where = " (torch on this machine's CPU: not comparable)" if foreign else ""
    lines.append(f"latency (us, {summary['threads']} thread(s), {summary['measured_on']}): "
                 f"torch {lat['torch']:.1f}  untuned {lat['untuned']:.1f}  tuned {lat['tuned']:.1f}"
                 f"{torch_where}")
    vs_torch = "" if foreign else f", {summary['speedup']['tuned_vs_torch']:.2f}x vs torch"
    lines.append(f"speed-up: {summary['speedup']['tuned_vs_untuned']:.2f}x vs untuned"
                 f"{vs_torch}; numerics "
                 f"{'match torch' if summary['numerics_ok'] else 'DO NOT match torch'} "
                 f"(max abs err {summary['max_abs_err']:.2e})")
    if not summary["numerics_ok"]:
        lines.append(numerics_hint(summary))
    single = [t for t in summary["tasks"] if t.get("single_schedule")]
    if single:
        lines.append(f"{len(single)} task(s) have one possible schedule: measured once, "
                     "not searched")
    fb = summary["schedules"]["fallback"]
    if fb:
        lines.append(f"default schedule for {len(fb)} function(s): "
                     + "; ".join(f"{k} ({v})" for k, v in fb.items()))
    none = summary.get("unmeasured_tasks") or []
    if none:
        lines.append(f"{len(none)} task(s) got no valid measurement, on the default schedule: "
                     f"{', '.join(none)} (errors: `farm status {summary['job_id']}`)")
    if summary.get("phones"):
        lines.append(f"phones: {len(summary['phones'])}, busy "
                     f"{100 * summary['phone_utilization']:.0f} % of the tuning wall "
                     f"({summary['tuning_wall_s']:.0f} s); report.html has their timeline")
    cpu = cpu_line(summary.get("cpu") or {})
    if cpu:
        lines.append(cpu)
    lines.append(f"wall time {summary['wall_s']:.0f} s, job {summary['job_id']}")
    return "\n".join(lines)
