"""Jobs already on a farm, from the client's side: the recent ones, cancel, resume, and a
job's progress as an object. What `farm status | cancel | resume` and `farm.Farm.jobs()`,
`farm.Job` share: each is written once, here."""

# Imports inside functions: the CLI loads a command's modules when it runs (`farm
# status` does not load the submit pipeline).

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from farm.core.aliases import JsonDict

if TYPE_CHECKING:
    from farm.core.config import FarmConfig
    from farm.core.messages import JobSpec
    from farm.pipeline.wait import View
    from farm.store.jobs import JobReader
    from farm.store.store import FarmView, RecordsAndJobs

RECENT_JOBS = 10  # what `farm status` (no job given) and `Farm.jobs()` list: the latest


def recent(store: JobReader, limit: int = RECENT_JOBS) -> list[str]:
    """The ids of the farm's latest `limit` jobs, oldest first."""
    ids = store.job_ids()
    return ids[max(0, len(ids) - limit):]


def views(store: FarmView, job_ids: list[str]) -> list[JsonDict]:
    """Each job as `farm status --json` shows it (farm/client/progress.py: job_view)."""
    from farm.client.progress import job_view

    return [job_view(store, store.require_job(job_id)) for job_id in job_ids]


def cancel(store: RecordsAndJobs, job_id: str) -> str:
    """`farm cancel JOB` (an id or a name): its rounds not yet started do not run (a
    StoreError naming an unknown job). Returns the job's id."""
    job_id = store.require_job(job_id).job_id
    store.set_job_status(job_id, state="cancelled", cancelled_at=str(time.time()))
    return job_id


def resume(job_id: str, config: FarmConfig, say: Callable[[str], None], *,
           out: Path | None = None, wait: bool = True, timeout_s: float | None = None,
           allow_pickle: bool = False, view: View | None = None) -> JsonDict:
    """`farm resume JOB`: continue a job from the records in the store (only what is missing
    is measured), on the job's own device key and round size; the summary, or with
    `wait=False` (a lab farm) {"job_id", "state"} once dispatched."""
    from farm.local.embedded import farm_store
    from farm.pipeline.job import SubmitOptions, submit
    from farm.pipeline.preflight import is_result

    with farm_store(config) as store:
        job = store.require_job(job_id)  # an id or a name
    config = replace(config, device_key=job.device_key, round_trials=job.round_trials)
    opts = SubmitOptions.from_job(job, out=out, timeout_s=timeout_s, wait=wait,
                                  allow_pickle=allow_pickle)
    # the job's own --out is replaced only when it holds a result of the farm's (a store
    # others can write must not name a folder for this command to delete)
    opts = replace(opts, force=out is not None or is_result(opts.out))
    result = submit(opts, config, say=say, resume=job.job_id, view=view)
    result.setdefault("out", str(opts.out))  # a job not waited for: where it will be
    return result


@dataclass(frozen=True)
class TaskProgress:
    """One task of a job: its trials in the store against its goal, its best so far."""

    name: str
    workload_key: str
    state: str  # queued | waiting | tuning | done | exhausted | failed
    trials: int  # in the store (this job's and earlier ones')
    goal: int
    best_us: float | None


@dataclass(frozen=True)
class Progress:
    """A job's progress, as `on_progress=` callbacks receive it: `line` is the text a
    `report=` callback gets; `state` the job's (running, cancelled, failed, ...)."""

    job_id: str
    state: str
    trials_done: int  # measured by this job
    trials_total: int  # done + what is left of its budget
    tasks_finished: int
    tasks: tuple[TaskProgress, ...]
    line: str

    @property
    def best_us(self) -> dict[str, float | None]:
        """Per task name, its best latency so far (None: nothing valid yet)."""
        return {t.name: t.best_us for t in self.tasks}

    @classmethod
    def of(cls, view: JsonDict, line: str = "") -> Progress:
        """From a job's view (`farm status --json`, `Job.status()`)."""
        return cls(job_id=view["job_id"], state=view["status"].get("state", "running"),
                   trials_done=view["trials_measured"],
                   trials_total=view["trials_measured"] + view["trials_left"],
                   tasks_finished=view["tasks_finished"],
                   tasks=tuple(TaskProgress(name=t["name"], workload_key=t["workload_key"],
                                            state=t["state"], trials=t["trials_in_store"],
                                            goal=t["trials_goal"], best_us=t.get("best_us"))
                               for t in view["tasks"]),
                   line=line)


def progress_now(store: FarmView, job: JobSpec) -> Progress:
    """The job's progress read from the store now."""
    from farm.client.progress import job_view
    from farm.pipeline.wait import progress_line

    line = progress_line(job, store.task_states(job.job_id), store.job_measured(job.job_id))
    return Progress.of(job_view(store, job), line)


class ProgressFeed:
    """A waiting job's `view` (farm/pipeline/wait.py) that hands each change to the API's
    callbacks: the line to `report` (as without a view), a Progress to `on_progress`. The
    job's whole view is read only when its line changed (a task's state or the trials)."""

    def __init__(self, say: Callable[[str], None],
                 on_progress: Callable[[Progress], None] | None) -> None:
        self.say, self.on_progress = say, on_progress
        self.last = ""

    def __call__(self, store: FarmView, job: JobSpec) -> None:
        from farm.pipeline.wait import progress_line

        line = progress_line(job, store.task_states(job.job_id), store.job_measured(job.job_id))
        if line == self.last:
            return
        self.last = line
        self.say(line)
        if self.on_progress is not None:
            from farm.client.progress import job_view

            self.on_progress(Progress.of(job_view(store, job), line))
