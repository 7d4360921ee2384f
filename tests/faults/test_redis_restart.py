"""Redis (AOF on) restarts mid-job: workers reconnect, the client keeps waiting, the job completes,
and every record committed before the restart is still there."""

from __future__ import annotations

import time

import pytest

from farm import services
from tests.faults.conftest import record_sets, run_through_fault

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def test_redis_restart_mid_job(small_farm, tmp_path):
    def restart_redis():
        time.sleep(1.5)  # appendfsync everysec: let the last second reach the AOF
        before = record_sets(small_farm["redis"])
        small_farm["redis_svc"].stop()
        time.sleep(3)
        svc, url = services.start_redis(small_farm["redis_dir"], small_farm["logs"],
                                        port=small_farm["redis_port"])
        small_farm["group"].add(svc)
        assert url == small_farm["redis"]
        return before

    run_through_fault(small_farm, tmp_path, restart_redis)
