"""tunefarm: a distributed auto-tuning farm for deep-learning models.

The data flow, one module per stage::

    ingest -> extract -> plan -> dispatch -> (workers: measure) -> store -> finalize -> compile

`farm.pipeline.job` shows a whole job stage by stage; `farm.Farm` is the Python API
(farm/client/api.py) the `farm` command's jobs are also reachable by:

    Farm, Job, Cache        a farm, a job on it, its record store (farm/client/api.py)
    Progress, TaskProgress  what `on_progress=` callbacks get (farm/client/jobs.py)
    SubmitOptions           what a job was asked to do (farm/pipeline/options.py)
    prepare                 the module a job's best/ applies to, without a farm
                            (farm/client/portable.py)
    FarmError and its subclasses, one per stage (farm/core/errors.py)
"""

__version__ = "0.1.0"
__all__ = ["Cache", "CompileError", "ExtractError", "Farm", "FarmError", "IngestError", "Job",
           "Progress", "ServiceError", "StoreError", "StoreUnavailable", "SubmitOptions",
           "TaskProgress",
           "TuneError", "UnmeasuredError", "UsageError", "prepare"]

# where each name lives; loaded when first asked for: a worker that imports `farm.core` does
# not load the client
_HOMES = {"Farm": "farm.client.api", "Job": "farm.client.api", "Cache": "farm.client.api",
          "Progress": "farm.client.jobs", "TaskProgress": "farm.client.jobs",
          "SubmitOptions": "farm.pipeline.options", "prepare": "farm.client.portable"}


def __getattr__(name: str) -> type:
    """`farm.Farm`, `farm.FarmError`, ... (see the module's docstring), imported on first use."""
    import importlib

    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)  # type: ignore[no-any-return]
    if name in __all__:
        # on first use: `import farm` (a worker's, a notebook's) loads nothing it does not ask for
        from farm.core import errors

        return getattr(errors, name)  # type: ignore[no-any-return]
    raise AttributeError(f"module 'farm' has no attribute {name!r}")
