"""`<out>/report.html`: one self-contained page (inline SVG, no network) explaining a job.

Per task the tuning curve over this job's trials (best latency so far on a log scale vs the
job's trial index, failed trials marked; farm/pipeline/curves.py), its GFLOPS, what the store
holds of it (`farm cache show KEY`); the whole model's estimated latency vs the job's trials;
the model's time per task, tuned vs untuned vs torch, failures by class, trials from the
store vs measured, the functions that kept a default schedule; and, with `against` (another
run's summary), the two runs side by side.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path

from farm.core.aliases import JsonDict
from farm.pipeline.curves import Point, TaskTrials, model_curve, task_trials
from farm.pipeline.summary import gflops, numerics_hint
from farm.pipeline.timeline import phone_table, svg_timeline
from farm.store.cold import every_record
from farm.store.phones import PhoneLedger
from farm.store.store import FarmView, RecordReader

W, H, PAD = 360, 160, 36
BLUE, GREEN, RED = "#1f77b4", "#2ca02c", "#d62728"  # a task's curve, the model's, failures


def log_ticks(lo: float, hi: float) -> list[float]:
    """Tick values of a log axis from `lo` to `hi`: 1, 2 and 5 times the powers of ten between
    them (only the powers when that makes more than 6), else its ends and middle."""
    ticks: list[float] = []
    for mult in ((1.0,), (1.0, 2.0, 5.0)):
        ticks = sorted(m * 10.0 ** k for k in range(math.floor(math.log10(lo)),
                                                     math.ceil(math.log10(hi)) + 1)
                       for m in mult if lo <= m * 10.0 ** k <= hi)
        if len(ticks) >= 3:
            return ticks if len(ticks) <= 6 or mult == (1.0,) else ticks[::2]
    return [lo, math.sqrt(lo * hi), hi]


def _errors(task: JsonDict) -> str:
    """The first message of each failure class of a task (the phone's or builder's words)."""
    items = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>"
                    for k, v in (task.get("errors") or {}).items())
    return f"<ul class=errors>{items}</ul>" if items else ""


def svg_curve(points: Sequence[Point], failed: Sequence[int] = (), *,
              x_label: str = "trials of this job", y_label: str = "best us",
              stroke: str = BLUE, title: str | None = None, cls: str = "curve") -> str:
    """A tuning curve: best latency so far (us, y, log scale) against the job's trial index
    (x), with axes; `failed`: trial indexes marked by red ticks on the x axis."""
    if not points:
        return (f'<svg class="{cls}" width="{W}" height="40"><text x="4" y="24">'
                f'{html.escape(title or "no valid trial in this job")}</text></svg>')
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = min([*xs, *failed]), max(max([*xs, *failed]), min(xs) + 1)
    y0, y1 = min(ys), max(max(ys), min(ys) * 1.05)
    left, bottom = PAD + 18, H - PAD + 8  # room for the y labels, and the x labels below

    def sx(x: float) -> float:
        return left + 6 + (x - x0) / (x1 - x0) * (W - left - 18)  # x0 clear of the y axis

    def sy(y: float) -> float:
        return bottom - math.log(y / y0) / math.log(y1 / y0) * (bottom - 24)

    path = " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}"
                    for i, (x, y) in enumerate(points))
    axes = (f'<line x1="{left}" y1="{bottom}" x2="{W - 12}" y2="{bottom}" stroke="#555"/>'
            f'<line x1="{left}" y1="24" x2="{left}" y2="{bottom}" stroke="#555"/>')
    axes += "".join(f'<line class="failed" x1="{sx(x):.1f}" y1="{bottom - 6}" x2="{sx(x):.1f}" '
                    f'y2="{bottom + 3}" stroke="{RED}" stroke-width="2"/>' for x in failed)
    for n in sorted({x0, (x0 + x1) // 2, x1}):
        axes += (f'<text x="{sx(n):.1f}" y="{bottom + 12}" font-size="9" '
                 f'text-anchor="middle">{n}</text>')
    for t in log_ticks(y0, y1):
        axes += (f'<text x="{left - 3}" y="{sy(t) + 3:.1f}" font-size="9" '
                 f'text-anchor="end">{t:.3g}</text>')
    axes += (f'<text x="{(left + W) / 2:.0f}" y="{H - 2}" font-size="10" '
             f'text-anchor="middle">{html.escape(x_label)}</text>'
             f'<text x="10" y="{(24 + bottom) / 2:.0f}" font-size="10" text-anchor="middle" '
             f'transform="rotate(-90 10 {(24 + bottom) / 2:.0f})">{html.escape(y_label)} '
             f'(log)</text>')
    title = title or (f"best {ys[-1]:.1f} us after {xs[-1]} trials (first valid: {ys[0]:.1f} us)"
                      + (f", {len(failed)} failed" if failed else ""))
    return (f'<svg class="{cls}" width="{W}" height="{H}" xmlns="http://www.w3.org/2000/svg">'
            f'<rect width="{W}" height="{H}" fill="#fafafa"/>{axes}'
            f'<path d="{path}" fill="none" stroke="{stroke}" stroke-width="2"/>'
            f'<text x="{left}" y="14" font-size="11">{html.escape(title)}</text></svg>')


def svg_bars(items: list[tuple[str, float]], unit: str = "us") -> str:
    """Horizontal bars with their whole labels (the label column is as wide as the longest)."""
    if not items:
        return ""
    top = max(v for _, v in items) or 1.0
    label_w = min(560, 12 + 6.5 * max(len(label) for label, _ in items))
    rows = []
    for i, (label, v) in enumerate(items):
        y = 8 + i * 22
        w = max(1.0, v / top * 260)
        rows.append(f'<text x="0" y="{y + 12}" font-size="11">{html.escape(label)}</text>'
                    f'<rect x="{label_w:.0f}" y="{y}" width="{w:.1f}" height="14" fill="#ff7f0e"/>'
                    f'<text x="{label_w + 6 + w:.1f}" y="{y + 12}" font-size="11">'
                    f'{v:.1f} {unit}</text>')
    return (f'<svg class="bars" width="{label_w + 340:.0f}" height="{16 + 22 * len(items)}" '
            f'xmlns="http://www.w3.org/2000/svg">{"".join(rows)}</svg>')


def cache_view(store: RecordReader, wk: str, top: int = 5) -> str:
    """What `farm cache show KEY` says of a task's workload, folded under its row."""
    records = sorted((r for r in store.records(wk) if r.valid),
                     key=lambda r: r.run_us or 0.0)[:top]
    rows = "".join(f"<tr><td><code>{html.escape(r.candidate[:12])}</code></td>"
                   f"<td>{_us(r.run_us)}</td><td>{html.escape(r.job_id or '-')}</td>"
                   f"<td>{html.escape(r.host or '-')}</td><td>{html.escape(r.source)}</td></tr>"
                   for r in records)
    return (f"<details><summary><code>farm cache show {html.escape(wk)}</code></summary>"
            f"<table><tr><th>candidate</th><th>us</th><th>job</th><th>host</th><th>source</th>"
            f"</tr>{rows}</table></details>")


def compare(summary: JsonDict, other: JsonDict) -> str:
    """This run beside another (`farm report OUT --against OUT2`): the model's latencies,
    then per task (matched by workload key) best latency, trials and the ratio."""
    a, b = summary["latency_us"], other["latency_us"]
    head = "".join(f"<tr><td>{k}</td><td>{a[k]:.1f}</td><td>{b[k]:.1f}</td>"
                   f"<td>{a[k] / b[k] if b[k] else float('nan'):.2f}</td></tr>"
                   for k in ("torch", "untuned", "tuned"))
    theirs = {t["workload_key"]: t for t in other["tasks"]}
    rows = []
    for t in summary["tasks"]:
        o = theirs.get(t["workload_key"])
        ratio = (f"{t['best_us'] / o['best_us']:.2f}" if o and t["best_us"] and o["best_us"]
                 else "-")
        rows.append(f"<tr><td>{html.escape(t['name'])}</td><td>{_us(t['best_us'])}</td>"
                    f"<td>{_us(o['best_us']) if o else 'not in that run'}</td><td>{ratio}</td>"
                    f"<td>{t['trials_measured']}</td><td>{o['trials_measured'] if o else '-'}</td>"
                    f"<td>{t.get('measure_s', 0):.0f}</td>"
                    f"<td>{o.get('measure_s', 0) if o else 0:.0f}</td></tr>")
    them = html.escape(f"{other['job_id']} ({other['model']}, {other.get('out', '')})")
    return f"""<h2 id="compare">Against job {them}</h2>
<p>ratio = this run / that run: below 1 is faster here. Wall time {summary['wall_s']:.0f} s here,
{other['wall_s']:.0f} s there.</p>
<table class="compare"><tr><th>model latency (us)</th><th>this run</th><th>that run</th>
<th>ratio</th></tr>{head}</table>
<table class="compare"><tr><th>task</th><th>best us here</th><th>best us there</th><th>ratio</th>
<th>trials here</th><th>trials there</th><th>measuring s here</th><th>measuring s there</th></tr>
{''.join(rows)}</table>"""


def phones_section(summary: JsonDict, store: PhoneLedger) -> str:
    """Each phone's part: the table, and the timeline of its batches (idle gaps are white)."""
    phones = summary.get("phones")
    if not phones:
        return ""

    spans = store.job_phone_spans(summary["job_id"])
    return (f"<h2>Phones: busy {100 * summary['phone_utilization']:.0f} % of the tuning wall "
            f"({summary['tuning_wall_s']:.0f} s)</h2>{phone_table(phones)}"
            f"<p>One row per phone, a bar per batch, coloured by task:</p>"
            f"{svg_timeline(spans, phones, summary['tuning_wall_s'])}")


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def job_trials(summary: JsonDict, store: FarmView) -> list[TaskTrials]:
    """Each task's trials in this job (farm/pipeline/curves.py); other jobs' records count
    for the model's estimate up to the job's end (when it was finalized)."""

    at = store.job_status(summary["job_id"]).get("finalized_at")
    until = float(at) if at else None
    # one pass over each device key's archive for every task, not one per task
    every = every_record(store, store.archive, [t["workload_key"] for t in summary["tasks"]])
    return [task_trials(every[t["workload_key"]], summary["job_id"], t["weight"], until)
            for t in summary["tasks"]]


def task_gflops(task: JsonDict, store: RecordReader) -> float | None:
    """The task's GFLOPS at its best latency: the summary's, or (a summary written before it
    had them) from the FLOPs the store keeps of its workload."""
    if "gflops" in task:
        return task["gflops"]
    workload = store.get_workload(task["workload_key"])
    return gflops(workload.flop if workload else 0.0, task["best_us"])


def _gflops(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}" if value >= 1000 else f"{value:.3g}"


def task_curve(task: JsonDict, trials: TaskTrials) -> str:
    """A task's tuning curve over this job's trials, and what it means where it has none."""
    failed = trials.failed()
    title = None
    if not trials.trials:
        title = "no trial in this job" + (f": the store's best, {task['best_us']:.1f} us"
                                          if task["best_us"] is not None else "")
    elif len(failed) == len(trials.trials):
        title = f"no valid trial in this job ({len(failed)} failed)"
    points = trials.best_so_far()
    svg = svg_curve(points, failed, title=title)
    if points and task["best_us"] is not None and task["best_us"] < points[-1][1] * 0.9995:
        svg += (f"<p class=note>the best applied, {task['best_us']:.1f} us, was measured "
                f"before this job</p>")
    if len(trials.trials) < task["trials_measured"]:  # whole records no longer readable here
        svg += (f"<p class=note>{len(trials.trials)} of the job's {task['trials_measured']} "
                f"trials are readable in this store</p>")
    return svg


def task_table(summary: JsonDict, store: RecordReader, trials: list[TaskTrials]) -> str:
    rows = []
    for t, tt in zip(summary["tasks"], trials, strict=True):
        rows.append(
            f"<tr><td>{html.escape(t['name'])}</td><td>{t['weight']}</td>"
            f"<td>{t['trials_measured']}</td><td>{t['trials_from_store']}</td>"
            f"<td>{_us(t['best_us'])}</td><td class=gflops>{_gflops(task_gflops(t, store))}</td>"
            f"<td>{_us(t.get('default_us'))}</td>"
            f"<td>{html.escape(t.get('best_from') or '-')}</td>"
            f"<td>{t['weight'] * (t['best_us'] or 0):.1f}</td>"
            f"<td>{html.escape(json.dumps(t.get('failures', {})))}{_errors(t)}</td>"
            f"<td>{t['device_lost']}</td>"
            f"<td>{html.escape(t['state'])}</td>"
            f"<td>{task_curve(t, tt)}{cache_view(store, t['workload_key'])}</td></tr>")
    return f"""<table><tr><th>task</th><th>weight</th><th>trials measured</th>
<th>trials from store</th><th>best us</th><th>GFLOPS at best</th><th>TVM's default schedule us</th>
<th>best from</th><th>weight x best</th><th>failures</th><th>device lost</th><th>state</th>
<th>tuning curve: best latency vs this job's trials (a red tick: a failed trial)</th></tr>
{''.join(rows)}</table>"""


def model_section(summary: JsonDict, trials: list[TaskTrials]) -> str:
    """The whole model's estimated latency as this job's trials accumulate."""
    points = model_curve(trials)
    tasks = summary["tasks"]
    target = sum(t["weight"] * t["best_us"] for t in tasks if t["best_us"] is not None)
    left_out = [t["name"] for t in tasks if t["best_us"] is None]
    title = (f"estimated {points[-1][1]:.1f} us after {points[-1][0]} trials "
             f"(from {points[0][1]:.1f} us)" if points else
             "no trial in this job: every task's best came from the store")
    svg = svg_curve(points, x_label="trials of this job (all tasks)", y_label="model us",
                    stroke=GREEN, title=title, cls="model-curve")
    missing = (f" Left out, without any valid run time: {html.escape(', '.join(left_out))}."
               if left_out else "")
    return f"""<h2 id="model">Whole model: estimated latency vs this job's trials</h2>
{svg}
<p>The sum over tasks of weight x best latency so far, after each trial of this job (every
task's trials in the order measured); a task starts from the best the store already had of
it (other jobs'). It ends at the sum of weight x best: {target:.1f} us (the tuned model
measured {summary['latency_us']['tuned']:.1f} us: the estimate leaves out what runs outside
the tasks' kernels).{missing}</p>"""


def render(summary: JsonDict, store: FarmView,
           against: JsonDict | None = None) -> str:
    lat = summary["latency_us"]
    mismatch = "" if summary["numerics_ok"] else f": {html.escape(numerics_hint(summary))}"
    tasks = summary["tasks"]
    trials = job_trials(summary, store)
    total_weighted = sum(t["weight"] * (t["best_us"] or 0) for t in tasks) or 1.0
    shares = svg_bars([(t["name"], 100.0 * t["weight"] * (t["best_us"] or 0) / total_weighted)
                       for t in tasks], unit="%")
    fallback = summary["schedules"]["fallback"]
    fb_rows = "".join(f"<li>{html.escape(k)}: {html.escape(v)}</li>" for k, v in fallback.items())
    failures: dict[str, int] = {}
    for t in tasks:
        for k, v in t.get("failures", {}).items():
            failures[k] = failures.get(k, 0) + v
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>tunefarm report {html.escape(summary['job_id'])}</title>
<style>body{{font-family:sans-serif;margin:24px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;font-size:13px;vertical-align:middle}}
table.compare{{margin:10px 0}}</style></head>
<body>
<h1>tunefarm: {html.escape(summary['model'])}</h1>
<p>job {html.escape(summary['job_id'])}, device key {html.escape(summary['device_key'])},
target <code>{html.escape(json.dumps(summary['target']))}</code>,
{summary['trials_per_task']} trials per task, wall time {summary['wall_s']:.0f} s.</p>
<h2>Latency ({summary['threads']} thread(s), {html.escape(summary['measured_on'])})</h2>
{svg_bars([("torch eager", lat["torch"]), ("TVM untuned", lat["untuned"]), ("TVM tuned", lat["tuned"])])}
<p>speed-up {summary['speedup']['tuned_vs_untuned']:.2f}x vs untuned,
{summary['speedup']['tuned_vs_torch']:.2f}x vs torch; numerics
{'match torch' if summary['numerics_ok'] else '<b>do not match torch</b>'}
(max abs err {summary['max_abs_err']:.2e}){mismatch}.</p>
{model_section(summary, trials)}
<h2>Share of the tuned model's time per task (weight x best latency)</h2>
{shares}
<h2>Tasks</h2>
{task_table(summary, store, trials)}
{phones_section(summary, store)}
<h2>Failures by class</h2><p>{html.escape(json.dumps(failures)) if failures else 'none'}</p>
<h2>Default schedules</h2>
<p>{len(summary['schedules']['from_log'])} function(s) took their schedule from the log.</p>
<ul>{fb_rows or '<li>none fell back to a default schedule</li>'}</ul>
{compare(summary, against) if against is not None else ''}
</body></html>
"""


def write(out_dir: Path, summary: JsonDict, store: FarmView,
          against: JsonDict | None = None) -> Path:
    path = out_dir / "report.html"
    path.write_text(render(summary, store, against))
    return path
