"""The Python API: what the `farm` command does, for notebooks and scripts.

    import farm

    lab = farm.Farm()                         # the embedded farm ($FARM_BROKER_URL: that lab)
    job = lab.submit(net, example_inputs=(torch.randn(1, 3, 224, 224),),
                     trials_per_task=32, out="runs/net")
    job.summary["speedup"]                    # what `farm submit` prints, as a dict
    lab.cache.ls()                            # what the record store holds
    lab.jobs()                                # what `farm status` lists
    job = lab.job("20261205-...")             # a job already on the farm: status, cancel,
    job.cancel(); job.resume()                # resume, wait (as `farm cancel`, `farm resume`)

Contract:
- `Farm` holds a config, nothing else: it opens the store for each call and closes it, so a
  `Farm` can be kept in a notebook for days and pickled.
- The embedded farm (no broker) lives for one `submit`: the job runs to its end inside the
  call, and `Job.summary` is set when it returns. A lab farm can return at once
  (`wait=False`): `Job.status()` reads the store, `Job.wait()` waits, finalizes and compiles
  like `farm wait`.
- An `nn.Module` is exported here with `torch.export` (a `.pt2` in the results folder's
  parent, deleted after the job, or kept as `.<out>.<Class>.pt2` for a `wait=False` job that
  `Job.wait` compiles later); workers still receive TVM JSON only, never the module.
- `submit`'s keywords are `farm submit`'s flags, with the same defaults and meanings
  (farm/pipeline/options.py): `trials=N` is a job budget, and a task may take all of it
  unless `trials_per_task` caps it, as `--trials N`.
- Progress: `on_line=` gets each line as text (as the command prints it on stderr; `report=`,
  its name before, is still understood);
  `on_progress=` gets a `Progress` (farm/client/jobs.py) at each change while the job runs.
- Errors are `farm.FarmError`s naming their subject, as on the command line.
"""

# Imports inside functions: a call loads what it runs (`import farm` stays light:
# the client's modules pull TVM, torch or Redis only for the calls that use them).

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from farm.client.jobs import Progress
from farm.core.aliases import JsonDict, TorchModule
from farm.core.config import FarmConfig, load_config
from farm.core.errors import UsageError
from farm.pipeline.options import DEFAULT_DTYPE, DEFAULT_PRIORITY
from farm.store import RecordStore
from farm.store.store import FarmView

if TYPE_CHECKING:
    from farm.client.cache import ImportTally
    from farm.client.jobs import ProgressFeed
    from farm.client.progress import LiveView
    from farm.core.messages import JobSpec

OnLine = Callable[[str], None]  # a progress line
OnProgress = Callable[[Progress], None]


@dataclass
class Job:
    """A job on a farm. `summary` is what `<out>/summary.json` holds, once the job is compiled;
    `out` is its results folder (None: the job does not record one)."""

    farm: Farm
    job_id: str
    out: Path | None
    summary: JsonDict | None = None
    # `out` was named in this process (`Farm.submit`'s out, `resume`'s out=): `wait` may
    # replace it; an `out` read from the store is replaced only when it holds a result
    out_given: bool = False

    def status(self) -> JsonDict:
        """The job as `farm status JOB --json` shows it: per task its trials, best and state."""
        from farm.client.jobs import views

        with self.farm.store() as store:
            return views(store, [self.job_id])[0]

    def progress(self) -> Progress:
        """The job's progress now, as `on_progress` callbacks get it."""
        from farm.client.jobs import progress_now

        with self.farm.store() as store:
            return progress_now(store, store.require_job(self.job_id))

    def cancel(self) -> None:
        """As `farm cancel JOB`: its rounds not yet started do not run."""
        from farm.client.jobs import cancel

        with self.farm.store() as store:
            cancel(store, self.job_id)

    def resume(self, *, out: str | Path | None = None, wait: bool = True,
               timeout_s: float | None = None, allow_pickle: bool = False,
               on_line: OnLine | None = None, on_progress: OnProgress | None = None,
               progress: bool = False, report: OnLine | None = None) -> Job:
        """As `farm resume JOB`: continue the job from the records in the store (only what is
        missing is measured), into `out` (default: its own); with `wait=False` (a lab farm)
        return once dispatched. This Job, its summary set when it was compiled. `progress`:
        the live view while it waits, as `Farm.submit`'s."""
        from farm.client.jobs import resume

        on_line = _one(on_line, report)
        result = resume(self.job_id, self.farm.config, on_line or quiet,
                        out=None if out is None else Path(out), wait=wait,
                        timeout_s=timeout_s, allow_pickle=allow_pickle,
                        view=_feed(on_line, on_progress, progress))
        self.out = Path(result["out"])
        self.out_given = self.out_given or out is not None
        self.summary = result if "tasks" in result else None
        return self

    def wait(self, timeout_s: float | None = None, on_line: OnLine | None = None,
             on_progress: OnProgress | None = None, *, progress: bool = False,
             report: OnLine | None = None) -> JsonDict:
        """Wait for the job, then finalize and compile it into `out` (as `farm wait`); the
        summary. A non-empty `out` is replaced when this process named it (`submit`'s out,
        `resume`'s out=) or when it holds a result of the farm's, never else. A job of the
        embedded farm is finished when `submit` returns. `progress`: the live view while it
        waits, as `Farm.submit`'s."""
        if self.summary is not None:
            return self.summary
        from farm.pipeline.job import follow
        from farm.pipeline.preflight import is_result

        # a store others can write must not name a folder for this call to delete (as
        # `farm resume`, `farm wait`)
        force = self.out_given or (self.out is not None and is_result(self.out))
        on_line = _one(on_line, report)
        self.summary = follow(self.job_id, self.farm.config, on_line or quiet, out=self.out,
                              force=force, timeout_s=timeout_s,
                              view=_feed(on_line, on_progress, progress))
        return self.summary


@dataclass
class Cache:
    """The record store, as `farm cache` shows it (ls, show, stats, export, import, rm,
    verify, archive)."""

    farm: Farm

    def ls(self, device_key: str | None = None) -> list[JsonDict]:
        from farm.client import cache

        with self.farm.store() as store:
            return cache.entries(store, device_key)

    def show(self, workload_key: str, top: int = 5) -> JsonDict:
        from farm.client import cache

        with self.farm.store() as store:
            return cache.show(store, workload_key, top)

    def stats(self) -> JsonDict:
        from farm.client import cache

        with self.farm.store() as store:
            return cache.stats(store)

    def export(self, out_dir: str | Path, device_key: str | None = None,
               all_records: bool = False) -> int:
        """The best record per workload as a MetaSchedule JSONDatabase in `out_dir` (as
        `farm cache export`); with `all_records` every record, the archive's and failures
        too (`--all`). How many were written."""
        from farm.client import cache

        with self.farm.store() as store:
            if all_records:
                return cache.export_all(store, Path(out_dir), device_key)
            return cache.export(store, Path(out_dir), device_key)

    def import_log(self, log_dir: str | Path, device_key: str | None = None,
                   retarget: bool = False) -> ImportTally:
        """Seed the store from a JSONDatabase folder (unverified records); the tally of what
        it took and refused."""
        from farm.client import cache
        from farm.pipeline.job import tuned_profile

        profile = tuned_profile(self.farm._config(device_key=device_key), quiet)
        with self.farm.store() as store:
            return cache.import_log(store, Path(log_dir), profile, retarget=retarget)

    def rm(self, workload_keys: list[str], source: str | None = None) -> dict[str, int]:
        """Forget workloads, or only the records of `source` (a job id, host or import
        path; every workload when `workload_keys` is empty), as `farm cache rm`."""
        from farm.client import cache

        with self.farm.store() as store:
            return cache.remove(store, workload_keys, source)

    def verify(self, workload_keys: list[str] | None = None, device_key: str | None = None,
               tracker: str | None = None) -> list[JsonDict]:
        """As `farm cache verify --json`: the stored bests measured again on a phone of the
        key (a lab farm needs `tracker`; the embedded farm starts its emulated phones)."""
        from farm.client.cmd_cache import verify

        return verify(self.farm._config(device_key=device_key), tracker, workload_keys,
                      quiet)[1]

    def archive(self) -> JsonDict:
        """As `farm cache archive`: the spool moved to the archive now, days past the
        retention deleted; what was done and what the archive holds."""
        from farm.client.cmd_cache import archive

        with self.farm.store() as store:
            return archive(store, self.farm.config.archive_retention_days)


@dataclass
class Farm:
    """A farm to tune on: the lab farm at `broker` (default $FARM_BROKER_URL), else the
    embedded one. `config` is a farm.toml; `settings` are FarmConfig fields (flags)."""

    broker: str | None = None
    config_file: str | Path | None = None
    settings: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.config: FarmConfig = load_config({**self.settings, "broker_url": self.broker},
                                              config_file=self.config_file)

    @property
    def embedded(self) -> bool:
        return not self.config.broker_url

    @property
    def cache(self) -> Cache:
        return Cache(self)

    @contextlib.contextmanager
    def store(self) -> Iterator[RecordStore]:
        """The farm's record store for a moment (the embedded farm's Redis is started for it)."""
        from farm.local.embedded import farm_store

        with farm_store(self.config) as store:
            yield store

    def job(self, ref: str) -> Job:
        """A job already on this farm, by its id or its name (`farm submit --name`; `farm
        status` lists both); a StoreError naming it when the farm has no such job."""
        with self.store() as store:
            spec = store.require_job(ref)
            job_id = spec.job_id
            out = store.job_status(job_id).get("out") or spec.options.get("out")
        return Job(self, job_id, Path(out) if out else None)

    def jobs(self, limit: int | None = None) -> list[JsonDict]:
        """The farm's latest jobs (`limit`, default as many as `farm status` lists), oldest
        first, each as `farm status --json` shows it (`Job.status()`)."""
        from farm.client.jobs import RECENT_JOBS, recent, views

        with self.store() as store:
            return views(store, recent(store, RECENT_JOBS if limit is None else limit))

    def submit(self, model: str | Path | TorchModule,
               example_inputs: tuple[object, ...] | None = None, *,
               out: str | Path, trials_per_task: int | None = None, trials: int | None = None,
               early_stop_rounds: int = 0, round_trials: int | None = None,
               device_key: str | None = None, phones: int | None = None, input_shape: str | None = None,
               dtype: str = DEFAULT_DTYPE, allow_pickle: bool = False,
               tracker: str | None = None, wait: bool = True, timeout_s: float | None = None,
               wait_for_devices_s: float = 0.0, priority: str = DEFAULT_PRIORITY,
               name: str | None = None, force: bool = False, on_line: OnLine | None = None,
               on_progress: OnProgress | None = None, progress: bool = False,
               report: OnLine | None = None) -> Job:
        """Tune `model` (a .pt2/.pt path, or an nn.Module with `example_inputs`) and compile
        it into `out`. The keywords are `farm submit`'s flags (`early_stop_rounds`:
        --early-stop, `wait=False`: --no-wait, a lab farm only; `name`: --name, then
        `Farm.job(name)` finds it); `trials_per_task` defaults
        to 32, and with a job budget `trials` to none (the budget); `trials=0` is no job
        budget, as None (the API's default once; `--trials` is at least 1). `device_key` and
        `round_trials` (and `phones`, the embedded farm's) override the farm's config for
        this job. `progress=True` draws the job's live view while it waits: one output cell
        updated in place in Jupyter, in place on a terminal, else plain lines (stderr)."""
        from farm.pipeline.job import SubmitOptions, submit
        from farm.pipeline.options import check_job_name, trial_budgets

        config = self._config(device_key=device_key, round_trials=round_trials,
                              phones=phones)
        on_line = _one(on_line, report)
        per_task, budget = trial_budgets(trials_per_task, trials, zero_is_none=True)
        out = Path(out)
        with model_file(model, example_inputs, out, keep=not wait) as path:
            opts = SubmitOptions(
                model=path, out=out, trials_per_task=per_task, trials_budget=budget,
                early_stop_rounds=early_stop_rounds, input_shape=input_shape, dtype=dtype,
                allow_pickle=allow_pickle, force=force, wait=wait, timeout_s=timeout_s,
                tracker=tracker, wait_for_devices_s=wait_for_devices_s, priority=priority,
                name=check_job_name(name))
            result = submit(opts, config, say=on_line or quiet,
                            view=_feed(on_line, on_progress, progress))
        job = Job(self, result["job_id"], out, out_given=True)
        if "tasks" in result:
            job.summary = result
        return job

    def _config(self, **flags: object) -> FarmConfig:
        """The farm's config with these flags (None: not given) over its settings, read as
        `farm submit` reads its flags (flag > FARM_* environment > file > default)."""
        given = {k: v for k, v in flags.items() if v is not None}
        if not given:
            return self.config
        return load_config({**self.settings, "broker_url": self.broker, **given},
                           config_file=self.config_file)


@contextlib.contextmanager
def model_file(model: str | Path | TorchModule, example_inputs: tuple[object, ...] | None,
               out: Path, keep: bool = False) -> Iterator[Path]:
    """A model file for `model` (`Farm.submit`, `farm.prepare`): the path given, or an
    nn.Module exported to a .pt2 beside `out`: for the call's lifetime, or kept (`keep`: a
    job that `Job.wait` compiles later)."""
    if isinstance(model, (str, Path)):
        if example_inputs is not None:
            raise UsageError("example_inputs are for an nn.Module; a model file carries its own "
                             "(or pass input_shape for a TorchScript .pt)", subject=str(model))
        yield Path(model)
        return
    from farm.pipeline.ingest import export_module

    parent = out.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    if keep:
        yield export_module(model, example_inputs,
                            parent / f".{out.name}.{type(model).__name__}.pt2")
        return
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.model-", dir=parent) as tmp:
        yield export_module(model, example_inputs, Path(tmp) / f"{type(model).__name__}.pt2")


def quiet(_line: str) -> None:
    """An `on_line` that drops the lines: the API's when no `on_line` callback is given."""


def _one(on_line: OnLine | None, report: OnLine | None) -> OnLine | None:
    """The progress-line callback, by its name (`on_line`) or its name before (`report`)."""
    if on_line is not None and report is not None:
        raise UsageError("on_line= and report= are the same callback (report= is its name "
                         "before): pass one", subject="report=")
    return on_line if on_line is not None else report


def _feed(on_line: OnLine | None, on_progress: OnProgress | None,
          progress: bool = False) -> ProgressFeed | LiveView | Views | None:
    """The waiting job's view for `on_progress` (and `on_line`) and, with `progress`, its
    live view (farm/client/progress.py) beside the lines to `on_line`; None: lines to
    `on_line` (the wait says them itself when no view is given)."""
    from farm.client.jobs import ProgressFeed
    from farm.client.progress import live_view

    # a view replaces the wait's own lines: `on_line` gets them from the feed
    fed = on_progress is not None or (progress and on_line is not None)
    feed = ProgressFeed(on_line or quiet, on_progress) if fed else None
    if not progress:
        return feed
    return live_view() if feed is None else Views([feed, live_view()])


@dataclass
class Views:
    """Several views of one waiting job, each called in turn, each closed at its end."""

    views: list[ProgressFeed | LiveView]

    def __call__(self, store: FarmView, job: JobSpec) -> None:
        for view in self.views:
            view(store, job)

    def close(self) -> None:
        for view in self.views:
            close = getattr(view, "close", None)
            if close is not None:
                close()
