"""Redis (AOF on) restarts mid-job: workers reconnect, the client keeps waiting, the job completes,
and every record committed before the restart is still there."""

from __future__ import annotations

import json
import time

import pytest

from farm import services
from tests.faults.conftest import (
    check_store,
    record_sets,
    start_submit,
    tiny_model,
    wait_for_records,
)

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def test_redis_restart_mid_job(small_farm, tmp_path):
    model = tiny_model(tmp_path / "tiny.pt2")
    out = tmp_path / "out"
    proc = start_submit(small_farm, model, out, tmp_path / "home", trials=12)
    try:
        wait_for_records(small_farm["redis"])
        time.sleep(1.5)  # appendfsync everysec: let the last second reach the AOF
        before = record_sets(small_farm["redis"])
        small_farm["redis_svc"].stop()
        time.sleep(3)
        svc, url = services.start_redis(small_farm["redis_dir"], small_farm["logs"],
                                        port=small_farm["redis_port"])
        small_farm["group"].add(svc)
        assert url == small_farm["redis"]
        _, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:] + small_farm["worker"].log_tail(40)
    after = record_sets(small_farm["redis"])
    for k, cands in before.items():
        assert cands <= after[k], "a record committed before the restart was lost"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["numerics_ok"]
    check_store(small_farm, summary)
