"""The report's phone timeline: one row per phone, a bar per batch it measured, coloured by
task, over the job's tuning wall; idle gaps are the white between the bars. A measurement
whose phone was lost is drawn black. Inline SVG, like the rest of report.html."""

from __future__ import annotations

import html

from farm.core.aliases import JsonDict
from farm.store.phones import PhoneSpan

# tab10 without the blue and orange the report's curves and bars use
PALETTE = ("#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#393b79", "#637939")
LOST = "#000000"
LABEL_W, PLOT_W, ROW_H = 230, 640, 22


def bars(spans: list[PhoneSpan]) -> list[tuple[str, str, float, float]]:
    """(phone, task, start, end) per phone and batch: a batch's measurements on one phone
    are one bar (from its first start to its last end)."""
    merged: dict[tuple[str, str], tuple[str, float, float]] = {}
    for s in spans:
        if s.outcome == "device_lost":
            continue
        task, start, end = merged.get((s.phone, s.batch), (s.task, s.start, s.end))
        merged[(s.phone, s.batch)] = (task, min(start, s.start), max(end, s.end))
    return [(phone, task, start, end) for (phone, _), (task, start, end) in merged.items()]


def svg_timeline(spans: list[PhoneSpan], phones: list[JsonDict], wall_s: float) -> str:
    """The timeline of `phones` (summary.json's rows, in order) over the last `wall_s` seconds
    of the job's measurements."""
    if not phones or not spans or wall_s <= 0:
        return "<p>no measurement on a phone in this job</p>"
    t1 = max(s.end for s in spans)
    t0 = t1 - wall_s
    row_of = {p["phone"]: i for i, p in enumerate(phones)}
    tasks = sorted({s.task for s in spans})
    colour = {t: PALETTE[i % len(PALETTE)] for i, t in enumerate(tasks)}

    def x(t: float) -> float:
        return LABEL_W + max(0.0, min(1.0, (t - t0) / wall_s)) * PLOT_W

    out = []
    for i, p in enumerate(phones):
        y = 8 + i * ROW_H
        hot = f", hot {p['hot']}x" if p.get("hot") else ""
        label = f"{p['phone']} ({p['worker']}) {100 * p['utilization']:.0f} % busy{hot}"
        out.append(f'<text x="0" y="{y + 12}" font-size="11">{html.escape(label)}</text>'
                   f'<rect x="{LABEL_W}" y="{y}" width="{PLOT_W}" height="14" fill="#f4f4f4"/>')
    for phone, task, start, end in bars(spans):
        y = 8 + row_of.get(phone, 0) * ROW_H
        out.append(f'<rect x="{x(start):.1f}" y="{y}" width="{max(1.0, x(end) - x(start)):.1f}" '
                   f'height="14" fill="{colour[task]}"><title>{html.escape(task)}: '
                   f'{end - start:.2f} s</title></rect>')
    for s in spans:
        if s.outcome == "device_lost" and s.phone in row_of:
            y = 8 + row_of[s.phone] * ROW_H
            out.append(f'<rect x="{x(s.start):.1f}" y="{y}" '
                       f'width="{max(2.0, x(s.end) - x(s.start)):.1f}" height="14" fill="{LOST}">'
                       f'<title>device lost ({html.escape(s.task)})</title></rect>')
    axis_y = 8 + len(phones) * ROW_H
    for k in range(5):
        out.append(f'<text x="{LABEL_W + k * PLOT_W / 4:.0f}" y="{axis_y + 10}" font-size="9" '
                   f'text-anchor="middle">{k * wall_s / 4:.0f} s</text>')
    legend = " ".join(f'<span style="color:{colour[t]}">&#9632;</span> {html.escape(t)}'
                      for t in tasks[:len(PALETTE)])
    more = f" (colours repeat: {len(tasks)} tasks)" if len(tasks) > len(PALETTE) else ""
    return (f'<svg class="timeline" width="{LABEL_W + PLOT_W + 10}" height="{axis_y + 16}" '
            f'xmlns="http://www.w3.org/2000/svg">{"".join(out)}</svg>'
            f'<p class="legend">{legend}{more} &middot; <span style="color:{LOST}">&#9632;</span>'
            f' device lost</p>')


def phone_table(phones: list[JsonDict]) -> str:
    rows = []
    for p in phones:
        mean = "-" if p["mean_ms"] is None else f"{p['mean_ms']:.0f}"
        heat = "-" if p.get("heat") is None else f"{100 * p['heat']:+.0f} %"
        rows.append(f"<tr><td>{html.escape(p['phone'])}</td><td>{html.escape(p['worker'])}</td>"
                    f"<td>{p['measurements']}</td><td>{p['busy_s']:.1f}</td>"
                    f"<td>{p['idle_s']:.1f}</td><td>{100 * p['utilization']:.0f} %</td>"
                    f"<td>{mean}</td><td>{p['device_lost']}</td><td>{heat}</td>"
                    f"<td>{p.get('hot', 0)}</td></tr>")
    return ("<table><tr><th>phone</th><th>worker host</th><th>measurements</th><th>busy s</th>"
            "<th>idle s</th><th>utilization</th><th>mean ms</th><th>device lost</th>"
            "<th title=\"its thermometer's last reading against its fastest\">heat</th>"
            "<th title=\"readings over its profile's heat_share: each set it resting\">hot</th>"
            f"</tr>{''.join(rows)}</table>")
