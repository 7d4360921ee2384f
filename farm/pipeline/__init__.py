"""The submit side of a job, in the order of the data flow: ingest -> extract (here) -> plan ->
dispatch (farm/jobs/plan.py, dispatch.py: shared with the workers, who plan and send a task's
later rounds) -> wait (here) -> finalize (farm/jobs/finalize.py: the client or the farm's
supervisor, whoever comes first) -> compile -> report (here); `job.py` strings them together.
Each stage is written once: a task's first round is built by the planner's `round_of`, as
its later rounds are."""
