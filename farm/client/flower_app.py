"""The Celery app Flower runs with (`celery -A farm.client.flower_app flower`).

Flower must read the broker as the farm writes it: kombu's keys under the farm's prefix, the
farm's priority steps (one Redis list per step) and its visibility timeout. A bare
`celery flower` would look for queues and events under Celery's default names and show
none. The broker URL and settings arrive in the environment (`farm flower`, `farm up` and
the compose file set them), never on a command line.
"""

from __future__ import annotations

from farm.core.config import load_config
from farm.jobs.dispatch import make_app

app = make_app(load_config())
