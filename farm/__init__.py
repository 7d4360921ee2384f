"""tunefarm: a distributed auto-tuning farm for deep-learning models.

The data flow, one module per stage::

    ingest -> extract -> plan -> dispatch -> (workers: measure) -> store -> finalize -> compile

`farm.pipeline.job` shows a whole job stage by stage; `farm.Farm` is the Python API
(farm/client/api.py) the `farm` command's jobs are also reachable by.
"""

__version__ = "0.1.0"
__all__ = ["Cache", "Farm", "FarmError", "Job", "prepare"]


def __getattr__(name: str) -> object:
    """`farm.Farm`, `farm.Job`, `farm.Cache` (farm/client/api.py), `farm.prepare`
    (farm/client/portable.py) and `farm.FarmError`, loaded when first asked for: a worker that
    imports `farm.core` does not load the client."""
    if name in ("Farm", "Job", "Cache"):
        from farm.client import api

        return getattr(api, name)
    if name == "prepare":
        from farm.client.portable import prepare

        return prepare
    if name == "FarmError":
        from farm.core.errors import FarmError

        return FarmError
    raise AttributeError(f"module 'farm' has no attribute {name!r}")
