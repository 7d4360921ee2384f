"""The stages of a job, in the order of the data flow: ingest -> extract -> plan -> dispatch -> finalize -> compile -> report; `job.py` strings them together."""
