"""How soon the store is full (farm/store/capacity.py): the arithmetic, and the rate read from
the records' own times."""

from __future__ import annotations

import pytest

from farm.core.messages import TuneTask
from farm.store import StoredRecord, open_store
from farm.store.capacity import DAY_S, Capacity, capacity


def test_days_until_full_at_the_current_rate():
    cap = Capacity(used_bytes=1_000_000, max_bytes=11_000_000, measurements=1000, per_day=500.0)
    assert cap.bytes_per_measurement == 1000.0
    assert cap.days_until_full == pytest.approx(20.0)  # 10 MB left, 0.5 MB a day
    assert Capacity(1_000, 0, 10, 5.0).days_until_full is None  # no limit
    assert Capacity(1_000, 5_000, 10, 0.0).days_until_full is None  # nothing measured lately
    assert Capacity(0, 5_000, 0, 0.0).bytes_per_measurement is None
    # what Redis holds empty is not the measurements': the rate of growth is theirs alone
    based = Capacity(used_bytes=1_000_000, max_bytes=11_000_000, measurements=1000,
                     per_day=500.0, base_bytes=900_000)
    assert based.bytes_per_measurement == 100.0
    assert based.days_until_full == pytest.approx(200.0)  # 10 MB left, 50 KB a day


TASK = TuneTask(name="w", workload_key="w", weight=1, mod_json="{}", target={"kind": "llvm"},
                device_key="k")


def test_the_rate_is_read_from_the_records_times():
    store = open_store("memory://")
    store.put_workload(TASK)
    now = 10 * DAY_S
    for i, age_s in enumerate([10, 100, DAY_S / 2, 2 * DAY_S, 3 * DAY_S]):
        store.add_record(StoredRecord(workload_key="w", candidate=f"c{i}", record=[{}, [1.0]],
                                      run_us=1.0, measured_at=now - age_s))
    cap = capacity(store, now=now)
    assert cap.measurements == 5 and cap.per_day == 3.0  # three within the last day
    young = open_store("memory://")  # a store an hour old: its rate over its life
    young.put_workload(TASK)
    for i in range(6):
        young.add_record(StoredRecord(workload_key="w", candidate=f"c{i}", record=[{}, [1.0]],
                                      run_us=1.0, measured_at=now - 3600))
    assert capacity(young, now=now).per_day == pytest.approx(6 * 24)


def test_doctor_warns_when_records_pile_up_for_the_archive(clean_redis, monkeypatch):
    from farm.client import doctor

    store = open_store(clean_redis, hot_records=1)
    store.put_workload(TASK)
    for i in range(4):
        store.add_record(StoredRecord(workload_key="w", candidate=f"c{i}", record=[{}, [1.0]],
                                      run_us=1.0 + i, measured_at=1.0))
    assert doctor.check_capacity(clean_redis).warn is False
    monkeypatch.setattr(doctor, "SPOOL_WARN", 2)  # 3 wait: nothing drained them
    check = doctor.check_capacity(clean_redis)
    assert check.warn and "3 records wait" in check.detail and "farm cache archive" in check.fix


def test_doctor_says_when_the_worker_hosts_do_not_share_one_archive(clean_redis, tmp_path):
    """Hosts archiving into one folder read one id; the same path on another machine is
    another folder with an id of its own (a folder of its own here); doctor tells them apart."""
    import time

    from farm.client import doctor
    from farm.store.cold import Archive
    from farm.store.hosts import HostBeat

    shared, own = str(tmp_path / "shared"), str(tmp_path / "own")
    first, again, other = Archive(shared).identity(), Archive(shared).identity(), \
        Archive(own).identity()
    assert first == again != other and len(first) == 32
    store = open_store(clean_redis)

    def beat(name: str, url: str, ident: str, error: str = "") -> None:
        store.publish_host(HostBeat(name=name, tracker="t", beat_at=time.time(), archive=url,
                                    archive_id=ident, archive_error=error), ttl_s=60)

    beat("a", shared, first)
    beat("b", shared, again)
    check = doctor.check_archive(clean_redis)
    assert check.ok and not check.warn and "share one archive" in check.detail, check
    beat("c", own, other)
    check = doctor.check_archive(clean_redis)
    assert check.ok and check.warn and "2 different places" in check.detail, check
    assert "FARM_ARCHIVE" in check.fix
    beat("c", "s3://lab/farm", "", "PermissionError: denied")
    check = doctor.check_archive(clean_redis)
    assert not check.ok and "c: s3://lab/farm: PermissionError" in check.detail, check


def test_first_users_of_an_archive_at_once_agree_on_its_id(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from farm.store.cold import Archive

    url = str(tmp_path / "new")
    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(lambda _: Archive(url).identity(), range(16)))
    assert len(ids) == 1 and len(next(iter(ids))) == 32, ids
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == [".archive-id"]
