"""What runs on a worker host: the Celery round task, the tracker slice, the measuring round.

Depends on `farm` (messages, store, keys, config), never the other way round.
Worker hosts need no torch.
"""
