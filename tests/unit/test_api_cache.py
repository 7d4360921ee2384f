"""`farm.Cache` does what `farm cache` does, refusals included: `Cache.rm` on a farm's store."""

from __future__ import annotations

import pytest

import farm
from farm.core.messages import TuneTask
from farm.store import StoredRecord


@pytest.fixture
def lab(clean_redis, tmp_path, monkeypatch) -> farm.Farm:
    monkeypatch.setenv("FARM_HOME", str(tmp_path / "home"))
    lab = farm.Farm(broker=clean_redis)
    with lab.store() as store:
        for wk in ("wa", "wb"):
            store.put_workload(TuneTask(name=f"task {wk}", workload_key=wk, weight=1,
                                        mod_json="{}", target="{}", device_key="cpu-local"))
            store.add_record(StoredRecord(workload_key=wk, candidate=f"c-{wk}", record=[],
                                          run_us=10.0, job_id="j1"))
    return lab


def test_rm_needs_keys_or_a_source(lab):
    with pytest.raises(farm.UsageError, match="needs workload keys or --source"):
        lab.cache.rm([])
    assert sorted(r["workload_key"] for r in lab.cache.ls()) == ["wa", "wb"]


def test_rm_of_an_unknown_workload_names_it_and_removes_nothing(lab):
    with pytest.raises(farm.UsageError, match="no such workload: nope") as e:
        lab.cache.rm(["wa", "nope"])
    assert e.value.subject == "farm cache rm"
    with pytest.raises(farm.UsageError, match="no such workload: nope"):
        lab.cache.rm(["nope"], source="j1")
    assert sorted(r["workload_key"] for r in lab.cache.ls()) == ["wa", "wb"]
    assert lab.cache.rm(["wa"]) == {"workloads": 1, "records": 0}
    assert lab.cache.rm([], source="j1") == {"workloads": 0, "records": 1}


def test_farm_cache_rm_refuses_the_same(lab, capsys):
    from farm.client import cli

    assert cli.main(["cache", "rm", "--broker", str(lab.broker)]) == 2
    assert cli.main(["cache", "rm", "wa,nope", "--broker", str(lab.broker)]) == 2
    err = capsys.readouterr().err
    assert "needs workload keys or --source" in err and "no such workload: nope" in err
    assert cli.main(["cache", "rm", "wa", "--broker", str(lab.broker)]) == 0
    assert [r["workload_key"] for r in lab.cache.ls()] == ["wb"]
