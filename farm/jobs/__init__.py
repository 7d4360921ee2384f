"""The jobs layer: what both sides of the farm stand on, between the store and them.

- `plan`: the planner (budgets, the first rounds, early stop, which task gets the next
  round), pure: no I/O;
- `dispatch`: sends rounds (Celery messages, one queue per device key) and reads the
  broker's queues through the store package's broker adapter;
- `advance`: after a round, the task's next step, written to the store and sent;
- `finalize`: a job's best record per workload, fixed once, into one best-config log;
- `fence`: a round's lease, so that one copy of it runs and only its holder moves the
  job on;
- `supervisor`: the farm-wide sweep one worker leads (lost rounds sent again, finished
  jobs finalized).

The submit pipeline (farm/pipeline) and the workers (workers/) import this layer; it
imports neither.
"""
