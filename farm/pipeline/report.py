"""`<out>/report.html`: one self-contained page (inline SVG, no network) explaining a job.

Per task the tuning curve (best latency vs trials), the model's time per task
before and after tuning, tuned vs untuned vs torch, failures by class, trials
from the store vs measured, and the functions that kept a default schedule.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from farm.store import RecordStore

W, H, PAD = 360, 160, 36


def curve(store: RecordStore, wk: str) -> list[tuple[int, float]]:
    """(trial number, best latency so far in us) over the workload's records, in measured order."""
    records = sorted(store.records(wk), key=lambda r: r.measured_at)
    out, best = [], None
    for i, r in enumerate(records, 1):
        if r.valid and (best is None or r.run_us < best):  # type: ignore[operator]
            best = r.run_us
        if best is not None:
            out.append((i, float(best)))
    return out


def svg_curve(points: list[tuple[int, float]]) -> str:
    if not points:
        return '<svg width="360" height="40"><text x="4" y="24">no valid record</text></svg>'
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    x0, x1 = min(xs), max(max(xs), min(xs) + 1)
    y0, y1 = min(ys), max(max(ys), min(ys) * 1.05 + 1e-9)

    def sx(x: float) -> float:
        return PAD + (x - x0) / (x1 - x0) * (W - 2 * PAD)

    def sy(y: float) -> float:
        return H - PAD + -(y - y0) / (y1 - y0) * (H - 2 * PAD)

    path = " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}"
                    for i, (x, y) in enumerate(points))
    return (f'<svg class="curve" width="{W}" height="{H}" xmlns="http://www.w3.org/2000/svg">'
            f'<rect width="{W}" height="{H}" fill="#fafafa"/>'
            f'<path d="{path}" fill="none" stroke="#1f77b4" stroke-width="2"/>'
            f'<text x="{PAD}" y="14" font-size="11">best {ys[-1]:.1f} us after {xs[-1]} trials'
            f' (first valid: {ys[0]:.1f} us)</text>'
            f'<text x="{PAD}" y="{H - 8}" font-size="10">trials {x0}..{x1}</text></svg>')


def svg_bars(items: list[tuple[str, float]], unit: str = "us") -> str:
    if not items:
        return ""
    top = max(v for _, v in items) or 1.0
    rows = []
    for i, (label, v) in enumerate(items):
        y = 8 + i * 22
        w = max(1.0, v / top * 260)
        rows.append(f'<text x="0" y="{y + 12}" font-size="11">{html.escape(label)}</text>'
                    f'<rect x="110" y="{y}" width="{w:.1f}" height="14" fill="#ff7f0e"/>'
                    f'<text x="{116 + w:.1f}" y="{y + 12}" font-size="11">{v:.1f} {unit}</text>')
    return (f'<svg class="bars" width="460" height="{16 + 22 * len(items)}" '
            f'xmlns="http://www.w3.org/2000/svg">{"".join(rows)}</svg>')


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def render(summary: dict[str, Any], store: RecordStore) -> str:
    lat = summary["latency_us"]
    tasks = summary["tasks"]
    rows = []
    for t in tasks:
        share_before = t["weight"] * (t["best_us"] or 0)
        rows.append(
            f"<tr><td>{html.escape(t['name'])}</td><td>{t['weight']}</td>"
            f"<td>{t['trials_measured']}</td><td>{t['trials_from_store']}</td>"
            f"<td>{_us(t['best_us'])}</td>"
            f"<td>{share_before:.1f}</td>"
            f"<td>{html.escape(json.dumps(t.get('failures', {})))}</td><td>{t['device_lost']}</td>"
            f"<td>{html.escape(t['state'])}</td>"
            f"<td>{svg_curve(curve(store, t['workload_key']))}</td></tr>")
    total_weighted = sum(t["weight"] * (t["best_us"] or 0) for t in tasks) or 1.0
    shares = svg_bars([(t["name"][:16], 100.0 * t["weight"] * (t["best_us"] or 0) / total_weighted)
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
td,th{{border:1px solid #ccc;padding:4px 8px;font-size:13px;vertical-align:middle}}</style></head>
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
(max abs err {summary['max_abs_err']:.2e}).</p>
<h2>Share of the tuned model's time per task (weight x best latency)</h2>
{shares}
<h2>Tasks</h2>
<table><tr><th>task</th><th>weight</th><th>trials measured</th><th>trials from store</th>
<th>best us</th><th>weight x best</th><th>failures</th><th>device lost</th><th>state</th>
<th>tuning curve (best latency vs trials)</th></tr>
{''.join(rows)}</table>
<h2>Failures by class</h2><p>{html.escape(json.dumps(failures)) if failures else 'none'}</p>
<h2>Default schedules</h2>
<p>{len(summary['schedules']['from_log'])} function(s) took their schedule from the log.</p>
<ul>{fb_rows or '<li>none fell back to a default schedule</li>'}</ul>
</body></html>
"""


def write(out_dir: Path, summary: dict[str, Any], store: RecordStore) -> Path:
    path = out_dir / "report.html"
    path.write_text(render(summary, store))
    return path
