"""The store every store contract test runs against: in-memory and a real Redis."""

import pytest

from farm.store import StoredRecord, open_store


@pytest.fixture(params=["memory", "redis"])
def store(request):
    if request.param == "memory":
        s = open_store("memory://")
    else:
        s = open_store(request.getfixturevalue("clean_redis"))
    yield s
    s.close()


def rec(cand: str, us: float | None, wk: str = "wk", job: str = "j1", err: str | None = None):
    """A record of candidate `cand` (valid with `us`, failed with `err`)."""
    return StoredRecord(workload_key=wk, candidate=cand, record=[{"t": cand}, [1.0], {}, []],
                        run_us=us, error_class=err, job_id=job)
