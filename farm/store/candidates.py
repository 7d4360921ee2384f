"""A candidate's identity in the store: a hash of its trace."""

from __future__ import annotations

import hashlib
import json

from farm.core.aliases import JsonList


def candidate_hash(record_json: JsonList) -> str:
    """The identity of a candidate: a hash of its trace (with the sampling decisions)."""
    trace = record_json[0]
    text = json.dumps(trace, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# TVM's default schedule of any workload: the function unscheduled, a trace that only gets its
# root block (workers/metaschedule/search.py measures it with a workload's first batch on a CPU)
DEFAULT_SCHEDULE = candidate_hash([[[["GetSBlock", [], ["root", "main"], ["b0"]]], []]])
# the source of a GPU workload's default-schedule record (TVM's dlight schedule: its trace, so
# its hash, differs per workload), where a CPU's is found by DEFAULT_SCHEDULE
DEFAULT_SOURCE = "default"
