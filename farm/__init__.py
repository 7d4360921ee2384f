"""tunefarm: a distributed auto-tuning farm for deep-learning models.

The data flow, one module per stage::

    ingest -> extract -> plan -> dispatch -> (workers: measure) -> store -> finalize -> compile

`farm.pipeline.job` shows a whole job stage by stage.
"""

__version__ = "0.1.0"
