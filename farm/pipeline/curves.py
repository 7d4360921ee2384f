"""The report's tuning curves, read from the store: each task's over the job's own trials,
and the whole model's estimated latency as the job's trials accumulate.

A job's trials of a task are the records the job measured of its workload (`job_id`), valid
and failed, in measured order: x is the trial's index in the job. Records of other jobs (and
imports) of the same workload are not its trials: they only set where the model's estimate
starts, as the best the store held of a task besides the job's own.
"""

from __future__ import annotations

from dataclasses import dataclass

from farm.store.store import StoredRecord, is_better

Point = tuple[int, float]  # (trial index in the job, latency in us)


@dataclass(frozen=True)
class TaskTrials:
    """A task's part in a job: its weight, the job's trials of it in measured order (time,
    run time in us; None: failed), and the best verified run time (us) of any other record of
    its workload measured before the job ended (None: the store had none)."""

    weight: int
    trials: list[tuple[float, float | None]]
    other_best: float | None

    def best_so_far(self) -> list[Point]:
        """(trial index, best run time so far) after each trial, from the first valid one."""
        out: list[Point] = []
        best: float | None = None
        for i, (_, us) in enumerate(self.trials, 1):
            if is_better(us, best):
                best = us
            if best is not None:
                out.append((i, best))
        return out

    def failed(self) -> list[int]:
        """The indexes of the job's failed trials of the task."""
        return [i for i, (_, us) in enumerate(self.trials, 1) if us is None]


def task_trials(records: list[StoredRecord], job_id: str, weight: int,
                until: float | None = None) -> TaskTrials:
    """The job's trials of a workload, from every record of it (the archive's too:
    farm/store/cold.every_record), and the best of the others measured up to `until` (the
    job's end; None: any time)."""
    own: list[tuple[float, float | None]] = []
    other: float | None = None
    for r in records:
        if r.job_id == job_id:
            own.append((r.measured_at, r.run_us if r.valid else None))
        elif (r.valid and r.verified and (until is None or r.measured_at <= until)
              and is_better(r.run_us, other)):
            other = r.run_us
    own.sort(key=lambda t: t[0])
    return TaskTrials(weight, own, other)


def model_curve(tasks: list[TaskTrials]) -> list[Point]:
    """The model's estimated latency after each trial of the job (all tasks' trials in
    measured order): the sum over tasks of weight x best run time so far, a task starting
    from the store's best of it besides the job's (`other_best`). Tasks that never get a run
    time are left out; the curve starts once every other task has one. Non-increasing: a
    trial only ever lowers its task's best."""
    merged = sorted(((at, i, us) for i, t in enumerate(tasks) for at, us in t.trials),
                    key=lambda m: m[0])
    best = [t.other_best for t in tasks]
    counted = [i for i, t in enumerate(tasks)
               if t.other_best is not None or any(us is not None for _, us in t.trials)]
    out: list[Point] = []
    for n, (_, i, us) in enumerate(merged, 1):
        if is_better(us, best[i]):
            best[i] = us
        total = 0.0
        for j in counted:
            b = best[j]
            if b is None:
                break  # a task without a run time yet: no estimate
            total += tasks[j].weight * b
        else:
            out.append((n, total))
    return out
