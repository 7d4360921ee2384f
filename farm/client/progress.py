"""What `farm status` and a waiting `farm submit` show: per job, per task a bar, the best
latency and the state; totals, the measured trial rate and an ETA. Built from the store only,
so any terminal on the farm (not just the submitting one) sees the same."""

from __future__ import annotations

import time
from typing import TextIO

from farm.core.aliases import JsonDict
from farm.core.messages import JobSpec
from farm.pipeline.summary import numerics_hint, phone_section
from farm.store import RecordStore, TaskState
from farm.store.store import COUNTERS, total_counts

BAR = 20


def job_view(store: RecordStore, job: JobSpec, now: float | None = None) -> JsonDict:
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
    finished = sum(1 for t in tasks if t["state"] in ("done", "exhausted", "failed"))
    running = status.get("state", "running") == "running" and finished < len(tasks)
    eta = left / rate * 60 if running and rate > 0 else None
    phones = phone_section(store, job, now=now if running else None)
    return {"job_id": job.job_id, "model": job.model, "device_key": job.device_key,
            "store_full": store.full(),
            "priority": job.priority, "run": job.run, "status": status, "tasks": tasks,
            "tasks_finished": finished, "trials_measured": done, "trials_left": left,
            "measurements": total_counts(counts),
            "trials_per_min": round(rate, 2), "elapsed_s": round(elapsed, 1),
            "eta_s": None if eta is None else round(eta, 1), **phones}


def _bar(done: int, goal: int) -> str:
    filled = BAR if goal <= 0 else min(BAR, round(BAR * done / goal))
    return "#" * filled + "." * (BAR - filled)


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _state(t: JsonDict) -> str:
    if t["state"] == "tuning" and t.get("host"):
        return f"tuning on {t['host']}"
    if t["state"] == "failed":
        return f"failed: {t['message']}"
    return t["state"]


def render(view: JsonDict, width: int = 48) -> str:
    """The view as terminal lines."""
    st = view["status"].get("state", "running")
    head = (f"job {view['job_id']} ({view['model']}, {view['device_key']}, {st}): "
            f"{view['tasks_finished']}/{len(view['tasks'])} tasks, "
            f"{view['trials_measured']} trials measured at {view['trials_per_min']:.1f}/min, "
            f"{view['trials_left']} left, elapsed {_duration(view['elapsed_s'])}, "
            f"ETA {_duration(view['eta_s'])}")
    lines = [head]
    if view.get("store_full"):
        lines.append(f"  the store is full: {view['store_full']}")
    if st == "failed" and view["status"].get("message"):
        lines.append(f"  {view['status']['message']}")
    for t in view["tasks"]:
        best = f"{t['best_us']:.1f} us" if t.get("best_us") else "-"
        lines.append(f"  {t['name'][:width]:{width}} [{_bar(t['trials_in_store'], t['trials_goal'])}] "
                     f"{t['trials_in_store']:4}/{t['trials_goal']:<4} best {best:>11}  {_state(t)}")
        if t["state"] in ("waiting", "queued", "tuning") and t.get("message"):
            lines.append(f"  {'':{width}}   {t['message']}")
        for cls, text in (t.get("errors") or {}).items():  # the phone's own words, first of each
            lines.append(f"  {'':{width}}   {cls} x{t['failures'].get(cls, t.get('device_lost', 0))}"
                         f": {text}")
    m = view.get("measurements", {})
    if m.get("measurements"):
        lines.append(f"  phone measurements: {m['measurements']} ({m['new']} new records, "
                     f"{m['duplicates']} measured twice, {m['device_lost']} device lost)")
    for p in view.get("phones", []):
        if p["measurements"] or p["device_lost"]:
            lines.append(f"  phone {p['phone']} on {p['worker']}: {p['measurements']} measured, "
                         f"busy {p['busy_s']:.0f} s ({100 * p['utilization']:.0f} %), "
                         f"mean {p['mean_ms']:.0f} ms, {p['device_lost']} device lost")
        else:
            lines.append(f"  phone {p['phone']} on {p['worker']}: measured nothing")
    return "\n".join(lines)


class LiveView:
    """The per-task view of a job, redrawn in place on a terminal at every poll (what
    `farm submit` shows while the workers measure)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        import sys

        self.stream = stream if stream is not None else sys.stderr
        self.drawn = 0  # lines of the view on screen

    def __call__(self, store: RecordStore, job: JobSpec) -> None:
        text = render(job_view(store, job))
        self.stream.write((f"\x1b[{self.drawn}A\x1b[J" if self.drawn else "") + text + "\n")
        self.stream.flush()
        self.drawn = text.count("\n") + 1


def format_table(summary: JsonDict) -> str:
    rows = [("task", "trials", "from store", "best us", "default us", "state")]
    for t in summary["tasks"]:
        best = f"{t['best_us']:.1f}" if t["best_us"] is not None else "-"
        default = f"{t['default_us']:.1f}" if t.get("default_us") is not None else "-"
        rows.append((t["name"][:48], str(t["trials_measured"]), str(t["trials_from_store"]),
                     best, default, t["state"]))
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
    lines.append(f"wall time {summary['wall_s']:.0f} s, job {summary['job_id']}")
    return "\n".join(lines)
