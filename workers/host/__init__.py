"""The worker host process: `farm worker` (`main`), its Celery app and round task (`app`),
the heartbeat (`heartbeat`) and Prometheus metrics (`metrics`)."""
