"""Helper hosts (workers/round/lend/: phone_side.py, helper_side.py): a phone host's rounds searched and built by a
helper host without phones, measured by the phone host's phones; a helper killed mid-search
costs the round nothing: the phone host searches the rest itself, nothing measured twice.

The phones have a device key of their own whose profile is not `host_cpu` (real phones: their
measurements take none of the host's cores), as phones a host lends its search for are."""

from __future__ import annotations

import json
import signal

import pytest
import redis

from farm.core import keys
from tests.faults.conftest import (
    Farm,
    check_store,
    run_through_fault,
    submit,
    tiny_model,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.faults]

KEY = "lab-phone"
HELPER = "farm@helper"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory):
    from farm.devices.hostcpu import system_cpu

    root = tmp_path_factory.mktemp("helper-lab")
    cpu = system_cpu()
    toml = root / "farm.toml"
    toml.write_text(f'[profiles.{KEY}]\ntarget = {{ kind = "llvm"'
                    f'{f", mcpu = {json.dumps(cpu)}" if cpu else ""} }}\nhost_cpu = false\n')
    # every round lends its search (the phone host is not short of cores here); rounds of two
    # batches, so that a helper killed mid-round leaves a round half done
    farm = Farm(root, key=KEY, env={"FARM_CONFIG": str(toml), "FARM_LEND_SEARCH": "always",
                                    "FARM_ROUND_TRIALS": "32", "FARM_HOST_TTL_S": "9"})
    try:
        farm.helper = farm.start_helper(HELPER)  # type: ignore[attr-defined]
        yield farm
    finally:
        farm.stop()


def test_a_helper_searches_and_builds_the_phone_hosts_rounds(lab: Farm, tmp_path):
    # one dense layer of its own: the other test's model shares no workload with it, in
    # whichever order the two run (its second layer would be that model's too)
    model = tiny_model(tmp_path / "tiny.pt2", width=72, layers=1)
    proc = submit(lab, model, tmp_path / "out", tmp_path / "home", trials=16)
    assert proc.returncode == 0, proc.stderr[-3000:] + lab.worker.log_tail(40)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["numerics_ok"]
    check_store(lab, summary)
    for t in summary["tasks"]:
        if t["single_schedule"]:
            continue
        assert t["searched_by"] == [HELPER], t
        assert t["trials_measured"] == 16, t
    # measured on the phone host's phones, committed by it: the records are the phone host's
    store = lab.store()
    hosts = {r.host for t in summary["tasks"] for r in store.records(t["workload_key"])
             if r.job_id == summary["job_id"]}
    store.close()
    assert hosts == {lab.host(0)}, hosts
    # the CPU account: the helper's search and builds, the phone host's measuring client
    cpu = summary["cpu"]
    assert cpu["helpers_s"]["build"] > 0 and cpu["helpers_s"]["search"] > 0, cpu
    assert cpu["phone_hosts_s"]["phones"] > 0 and not cpu["phone_hosts_s"]["build"], cpu
    helper_log = (lab.logs / next(p.name for p in lab.logs.glob("helper-*.log"))).read_text()
    assert "searching round 1 of" in helper_log


def session_in_flight(url: str) -> bool:
    """A search session a helper holds and nobody closed: a kill now lands mid-search."""
    r = redis.Redis.from_url(url, decode_responses=True)
    try:
        for k in r.scan_iter(keys.key_for("search", "*", "helper")):
            if not r.exists(k[:-len("helper")] + "closed"):
                return True
        return False
    finally:
        r.close()


def test_a_helper_killed_mid_search_costs_its_round_nothing(lab: Farm, tmp_path):
    def kill_helper():
        wait_until("a search session in flight", lambda: session_in_flight(lab.redis),
                   every_s=0.1)
        lab.helper.signal(signal.SIGKILL)  # type: ignore[attr-defined]

    try:
        summary = run_through_fault(lab, tmp_path, kill_helper, trials=32, width=80)
    finally:  # the other test (in whichever order they run) needs a helper
        if not lab.helper.alive():  # type: ignore[attr-defined]
            lab.helper = lab.start_helper(HELPER)  # type: ignore[attr-defined]
    for t in summary["tasks"]:
        assert t["trials_measured"] == 32 or t["single_schedule"], t
    log = lab.worker.log_tail(10_000)
    assert f"helper {HELPER} stopped beating" in log, log[-3000:]
    assert "searching the rest of the round here" in log
    # the rounds the helper began say so, though the phone host ended them
    assert any(HELPER in t["searched_by"] for t in summary["tasks"]), summary["tasks"]
