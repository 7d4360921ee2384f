"""What a job was asked to do: the options of `farm submit` and `farm.Farm.submit`, kept with
the job so that `farm resume` and `farm wait` can redo the client's part.

The one source of their defaults and meanings: the command's flags and the API's keywords
of one name mean the same here (`trial_budgets`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from farm.core.aliases import JsonDict
from farm.core.errors import StoreError, UsageError
from farm.core.messages import JobSpec
from farm.devices.hostcpu import cpu_of_target

DEFAULT_TRIALS = 32  # trials per task when neither --trials-per-task nor --trials says
DEFAULT_DTYPE = "float32"  # the inputs' dtype (--dtype, dtype=)
DEFAULT_PRIORITY = "normal"  # --priority, priority= (one of PRIORITIES)


def trial_budgets(trials_per_task: int | None, trials: int | None, *,
                  zero_is_none: bool = False) -> tuple[int, int]:
    """(trials per task, job budget) for `--trials-per-task` / `trials_per_task=` and
    `--trials` / `trials=`, None where left out. No job budget: every task gets
    `trials_per_task` (default DEFAULT_TRIALS). A job budget N: the planner spends N where it
    pays most, and a task may take all of it unless `trials_per_task` caps it. The job
    budget 0 is "none" (SubmitOptions.trials_budget). `--trials`, given, is at least 1;
    the API's `trials=0` (`zero_is_none`: its documented default before None) is no job
    budget, as None."""
    if zero_is_none and trials == 0 and not isinstance(trials, bool):
        trials = None
    if trials is not None and (isinstance(trials, bool) or not isinstance(trials, int)
                               or trials < 1):
        raise UsageError(f"must be a whole number >= 1, got {trials!r}", subject="--trials",
                         hint="e.g. --trials 500 (trials=500), or leave it out for no job "
                              "budget")
    if trials is None:
        return (DEFAULT_TRIALS if trials_per_task is None else trials_per_task), 0
    return (trials if trials_per_task is None else trials_per_task), trials


@dataclass(frozen=True)
class SubmitOptions:
    model: Path
    out: Path
    trials_per_task: int = DEFAULT_TRIALS  # per-task budget (the cap of each task in budget mode)
    trials_budget: int = 0  # > 0: a job budget spent by the planner (--trials N)
    early_stop_rounds: int = 0  # > 0: stop a task after this many rounds without gain
    input_shape: str | None = None
    dtype: str = DEFAULT_DTYPE
    allow_pickle: bool = False
    force: bool = False
    wait: bool = True
    timeout_s: float | None = None  # None: wait as long as the job runs
    tracker: str | None = None  # lab mode: where to run the compiled model (None: this CPU)
    wait_for_devices_s: float = 0.0  # lab mode: wait for a host with phones of the key
    priority: str = DEFAULT_PRIORITY  # high | normal | low (PRIORITIES)
    # the CPU a host_cpu profile is tuned for (None: found now, see target_cpu); a resumed
    # job keeps its own
    target_cpu: str | None = None
    name: str | None = None  # `--name`: held by this job while it runs (check_job_name)

    def to_job_options(self) -> JsonDict:
        """What `farm resume` and `farm wait` need to redo the client's part of the job."""
        return {"model": str(self.model.resolve()), "out": str(self.out.resolve()),
                "trials_per_task": self.trials_per_task, "trials_budget": self.trials_budget,
                "early_stop_rounds": self.early_stop_rounds, "input_shape": self.input_shape,
                "dtype": self.dtype, "allow_pickle": self.allow_pickle, "tracker": self.tracker,
                "priority": self.priority, "name": self.name}

    @classmethod
    def from_job(cls, job: JobSpec, out: Path | None = None, *, force: bool = False,
                 wait: bool = True, timeout_s: float | None = None,
                 allow_pickle: bool = False) -> SubmitOptions:
        o = job.options
        if not o.get("model"):
            raise StoreError("the job does not record how it was submitted",
                             subject=f"job {job.job_id}", hint="submit the model again")
        if out is None and not o.get("out"):
            raise UsageError("the job does not record its results folder",
                             subject=f"job {job.job_id}", hint="pass --out DIR")
        # what widens what the user asked for is never taken from the store: a pickle is
        # loaded only with this command's own --allow-pickle
        return cls(model=Path(o["model"]), out=out or Path(o["out"]),
                   trials_per_task=int(o.get("trials_per_task", job.trials_per_task)),
                   trials_budget=int(o.get("trials_budget", 0)),
                   early_stop_rounds=int(o.get("early_stop_rounds", 0)),
                   input_shape=o.get("input_shape"), dtype=o.get("dtype", DEFAULT_DTYPE),
                   tracker=o.get("tracker"),
                   priority=o.get("priority", DEFAULT_PRIORITY),
                   target_cpu=cpu_of_target(job.target), force=force, wait=wait,
                   timeout_s=timeout_s, allow_pickle=allow_pickle, name=o.get("name"))


NAME = re.compile(r"[A-Za-z][A-Za-z0-9._-]{0,63}")  # never a job id (those start with a digit)


def check_job_name(name: str | None) -> str | None:
    """`farm submit --name`: a letter, then up to 63 letters, digits, '.', '_' or '-'."""
    if name is not None and not NAME.fullmatch(name):
        raise UsageError("a job name is a letter, then up to 63 letters, digits, '.', '_' or "
                         "'-'", subject=f"--name {name!r}", hint="e.g. --name mobilenet-v2.nightly")
    return name
