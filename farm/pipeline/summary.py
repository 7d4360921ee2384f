"""summary.json: what a job did and what it gave, per task and for the whole model."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from farm.core.aliases import JsonDict
from farm.core.messages import JobSpec, TuneTask
from farm.pipeline import compile as compile_stage
from farm.store import StoredRecord, TaskState
from farm.store.candidates import DEFAULT_SCHEDULE, DEFAULT_SOURCE
from farm.store.hosts import registered_phones
from farm.store.jobs import added
from farm.store.phones import job_phones, tuning_wall
from farm.store.store import COUNTERS, FarmView, RecordReader, total_counts

if TYPE_CHECKING:
    from farm.pipeline.extract import Prepared


@dataclass(frozen=True)
class JobOutcome:
    """What the store says of a finished job's tasks, per workload key: their states, the
    trials the job measured and those it took from the store, the best record applied (None:
    none usable), the store's measurement counters, and the measured run time of TVM's
    default schedule where the store has it."""

    states: dict[str, TaskState]
    measured: dict[str, int]
    from_store: dict[str, int]
    bests: dict[str, StoredRecord | None]
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    defaults: dict[str, float] = field(default_factory=dict)


def make_summary(job: JobSpec, prep: Prepared, outcome: JobOutcome,
                 result: compile_stage.CompileResult, wall_s: float) -> JsonDict:
    """summary.json of a job: `prep` the model and its tasks, `outcome` what the store says of
    them, `result` the compiled model checked against torch, `wall_s` the client's time."""
    bundle, profile = prep.bundle, prep.profile
    states, measured, from_store = outcome.states, outcome.measured, outcome.from_store
    bests, counts, defaults = outcome.bests, outcome.counts, outcome.defaults
    rows = []
    for task in prep.extracted.tasks:
        wk = task.workload_key
        st = states.get(wk, TaskState())
        row = counts.get(wk, dict.fromkeys(COUNTERS, 0))
        best = bests.get(wk)
        best_us = best.run_us if best is not None else None  # a best record is valid
        rows.append({
            "name": task.name, "workload_key": wk, "weight": task.weight,
            "trials_measured": measured.get(wk, 0), "trials_from_store": from_store.get(wk, 0),
            "best_us": round(best_us, 3) if best_us is not None else None,
            "best_from": best_from(best, job.job_id),
            "flop": task.flop, "gflops": gflops(task.flop, best_us),
            "default_us": round(defaults[wk], 3) if wk in defaults else None,
            "failed": sum(st.failures.values()), "failures": st.failures,
            "valid": st.valid, "errors": st.errors,
            "device_lost": st.device_lost, "retries": row["retries"], "rounds": st.rounds,
            "measure_s": round(st.measure_s, 2),
            "cpu_s": round(sum(st.cpu.values()) + sum(st.helper_cpu.values()), 2),
            "single_schedule": st.single_schedule,
            "searched_by": st.searched_by,  # helper hosts (workers/round/lend/phone_side.py)
            "counts": row,
            "state": st.state,
            "message": st.message,
        })
    return {
        "job_id": job.job_id, "name": job.options.get("name"), "model": bundle.path, "format": bundle.fmt,
        "device_key": job.device_key, "target": job.target,
        "trials_per_task": job.trials_per_task,
        "inputs": [list(x.shape) for x in bundle.inputs],
        "priority": job.priority, "run": job.run,
        "tasks": rows,
        # every run sent to a phone, counted by the store: duplicates is "measured twice"
        "measurements": total_counts(counts),
        "cpu": cpu_section(states, sum(measured.values())),
        "latency_us": {"torch": round(bundle.torch_us, 2), "untuned": round(result.untuned_us, 2),
                       "tuned": round(result.tuned_us, 2)},
        "speedup": {"tuned_vs_untuned": round(result.untuned_us / result.tuned_us, 3),
                    "tuned_vs_torch": round(bundle.torch_us / result.tuned_us, 3)},
        "threads": profile.threads, "measured_on": result.measured_on,
        "numerics_ok": result.numerics_ok, "max_abs_err": result.max_abs_err,
        "untuned_numerics_ok": result.untuned_numerics_ok,
        "schedules": {"from_log": result.from_log, "fallback": result.fallback},
        "library": "model.so", "best_log": "best/",
        "wall_s": round(wall_s, 1),
    }


def cpu_section(states: dict[str, TaskState], measured: int) -> JsonDict:
    """The host CPU seconds of a job's rounds per part (workers/round/account.py), on its phone
    hosts and on the helper hosts that searched for them, in all and per trial measured."""
    none: dict[str, float] = {}
    here = functools.reduce(added, (s.cpu for s in states.values()), none)
    helpers = functools.reduce(added, (s.helper_cpu for s in states.values()), none)
    total = sum(here.values()) + sum(helpers.values())
    return {"phone_hosts_s": here, "helpers_s": helpers, "total_s": round(total, 2),
            "per_trial_s": round(total / measured, 3) if measured else None}


def cpu_line(cpu: JsonDict) -> str | None:
    """The CPU account in one line, the biggest parts first (None: nothing accounted)."""
    parts = added(cpu.get("phone_hosts_s") or {}, cpu.get("helpers_s") or {})
    if not cpu.get("total_s"):
        return None
    per = f", {cpu['per_trial_s']:.2f} s a trial" if cpu.get("per_trial_s") else ""
    split = ", ".join(f"{k} {v:.1f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])
                      if v >= 0.05)
    helpers = (f" ({sum(cpu['helpers_s'].values()):.1f} s on helper hosts)"
               if cpu.get("helpers_s") else "")
    return f"host CPU {cpu['total_s']:.1f} s{per}{helpers}: {split}"


def best_from(best: StoredRecord | None, job_id: str) -> str | None:
    """Where a task's best came from: "searched" (this job's search), "transferred from
    NAME" (a relative's schedule carried over, workers/metaschedule/transfer.py; measured by this
    job or an earlier one), "stored (job ID)" (measured by an earlier job), or an import's
    source; None without a best."""
    if best is None:
        return None
    if best.source == DEFAULT_SOURCE or best.candidate == DEFAULT_SCHEDULE:
        return "TVM's default schedule"
    if best.source.startswith("transfer:"):
        return "transferred from " + best.source.removeprefix("transfer:")
    if best.source != "job":
        return best.source
    return "searched" if best.job_id == job_id else f"stored (job {best.job_id or '?'})"


def gflops(flop: float, best_us: float | None) -> float | None:
    """GFLOPS of a kernel of `flop` floating-point operations that runs in `best_us`; None
    where either is unknown (TVM could not count the FLOPs: 0)."""
    if flop <= 0 or best_us is None or best_us <= 0:
        return None
    return float(f"{flop / best_us / 1e3:.4g}")  # flop / (us * 1e-6) / 1e9, 4 digits


def default_times(store: RecordReader, tasks: list[TuneTask]) -> dict[str, float]:
    """Workload key -> the measured run time of TVM's default schedule, where the store has it."""
    out = {}
    for task in tasks:
        rec = store.entry(task.workload_key, DEFAULT_SCHEDULE)
        if rec is not None and rec.valid and rec.run_us is not None:
            out[task.workload_key] = float(rec.run_us)
        elif rec is None and task.target.get("kind") != "llvm":  # a GPU's: by its source
            gpu = next((r for r in store.records(task.workload_key)
                        if r.source == DEFAULT_SOURCE and r.valid and r.run_us is not None), None)
            if gpu is not None:
                out[task.workload_key] = float(gpu.run_us)  # type: ignore[arg-type]
    return out


def phone_section(store: FarmView, job: JobSpec, now: float | None = None) -> JsonDict:
    """Each phone's part in the job: busy and idle seconds, utilization (busy / the tuning
    wall: from the job's start to its last measurement, or to `now` while it runs),
    measurements, device lost, heat (its thermometer's last reading against its fastest,
    and the hot readings: the farm's, not only this job's)."""
    spans = store.job_phone_spans(job.job_id)
    started = float(store.job_status(job.job_id).get("started_at") or 0) or None
    wall = tuning_wall(spans, started, until=now)
    rows = job_phones(spans, registered_phones(store.hosts(), job.device_key), wall)
    heat = {st.phone: st for st in store.phone_stats() if st.key == job.device_key}
    for row in rows:  # its heat: the thermometer's last reading against its fastest, hot ones
        st = heat.get(row["phone"])
        row["heat"] = None if st is None or st.heat is None else round(st.heat, 3)
        row["hot"] = st.hot if st is not None else 0
    busy = sum(r["busy_s"] for r in rows)
    return {"phones": rows, "tuning_wall_s": round(wall, 2),
            "phone_utilization": round(busy / (wall * len(rows)), 3) if rows and wall else 0.0}


def numerics_hint(summary: JsonDict) -> str:
    """Whose fault a mismatch with torch is: the untuned build tells TVM's import apart from
    the farm's tuning."""
    if summary.get("untuned_numerics_ok") is False:
        return ("the untuned build does not match torch either: TVM's import of the model is "
                "wrong, not the tuning (file it upstream with the model)")
    return ("the untuned build matches torch: a tuned schedule is wrong (keep out/ and the "
            "logs, and file it)")
