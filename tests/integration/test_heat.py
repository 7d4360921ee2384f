"""Heat on real phones (issue 51): a phone's thermometer read in the runner's sessions, a phone
that slows as it heats found hot by its own baseline, rested, and the sessions going to the
other phone. The phone heats as farm/devices/phone.py emulates it: from a moment on its
sessions run an eighth of the time (its kernels ~8x slower; a loaded 2-core test machine
slows a phone on its cores up to ~2x)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from farm.core.profiles import resolve_profile
from farm.devices.thermometer import thermometer
from farm.devices.tracker import phones as tracker_phones
from farm.devices.tracker import wait_for_phones
from farm.local import services
from farm.store import open_store
from workers.metaschedule import phonelog
from workers.metaschedule.phonelog import LostPolicy, PhoneLog

pytestmark = pytest.mark.integration
KEY = "warm"
HEAT_AFTER_S = 8.0  # the first phone heats this long after its first session


@pytest.fixture(scope="module")
def tracker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float, str]]:
    """A tracker with two phones of KEY; the first heats HEAT_AFTER_S after its first
    session. Yields the tracker, the time the heat begins at the latest and the phone that
    heats."""
    logs = tmp_path_factory.mktemp("heat")
    group = services.ServiceGroup()
    try:
        svc, addr = services.start_tracker(logs)
        group.add(svc)
        port = services.free_port()
        group.add(services.start_phone(addr, KEY, 0, logs, services.PhoneOptions(
            heat_after_s=HEAT_AFTER_S, port=port)))
        group.add(services.start_phone(addr, KEY, 1, logs))
        wait_for_phones(addr, KEY, 2, 60)
        yield addr, time.time() + HEAT_AFTER_S, f"127.0.0.1:{port}"
    finally:
        group.stop()


def sessions(tracker: str, path: Path, n: int, thermo: object) -> list[str]:
    """n measurement sessions one after another, as the runner's pool makes them, each
    reading its phone's thermometer first."""
    from tvm.s_tir.meta_schedule.runner import RPCConfig

    host, port = tracker.split(":")
    cfg = RPCConfig(tracker_host=host, tracker_port=int(port), tracker_key=KEY,
                    session_priority=1, session_timeout_sec=30)
    got = []
    for _ in range(n):
        session = phonelog.create_session(str(path), tracker, 0.0, cfg, heat=thermo)
        got.append(phonelog._SESSION.phone)
        phonelog.cleanup(str(path), session, None)
        del session
    return got


def test_a_phone_that_heats_is_found_hot_rests_and_the_other_measures(tracker, tmp_path):
    addr, heats_at, heater = tracker
    profile = replace(resolve_profile("cpu-local"), heat_check_s=0.01)  # read every session
    thermo = thermometer(profile)
    assert thermo is not None
    store = open_store("memory://")
    path = tmp_path / "phones.jsonl"
    log = PhoneLog(str(path), deadline_s=30, tracker=addr, key=KEY,
                   policy=LostPolicy(heat_share=1.5, heat_rest_s=600))
    heater = next(p for p in tracker_phones(addr)[KEY].phones if p.startswith(heater + "@"))

    def batch(n: int) -> dict[str, float]:
        sessions(addr, path, n, thermo)
        log.spans([], [], key=KEY, worker="w", job_id="j", workload_key="wk", task="t",
                  batch="b")
        return log.commit(store, [])

    while time.time() < heats_at - 3:  # both phones cool: their baselines
        assert batch(4) == {}, [(s.phone, s.heat_us, s.heat_base_us) for s in store.phone_stats()]
    read = {s.phone for s in store.phone_stats() if s.heat_base_us > 0}
    assert len(read) == 2, store.phone_stats()
    time.sleep(max(0.0, heats_at + 1 - time.time()))
    hot: dict[str, float] = {}
    deadline = time.monotonic() + 60
    while not hot and time.monotonic() < deadline:
        hot = batch(4)
    stats = {s.phone: s for s in store.phone_stats()}
    assert len(hot) == 1, [(s.phone, s.heat_us, s.heat_base_us) for s in stats.values()]
    (phone, cool_at), = hot.items()
    assert phone == heater
    assert cool_at > 0  # its last cool reading: what came after it is in doubt
    assert stats[phone].aside_why == "hot" and stats[phone].hot >= 1
    assert max(r.us for r in log.readings if r.phone == phone) > 2.5 * stats[phone].heat_base_us
    other = next(p for p in stats if p != phone)
    assert stats[other].hot == 0 and stats[other].aside_until == 0
    assert set(log.refresh(store)) == {phone}
    assert set(sessions(addr, path, 4, thermo)) == {other}  # it rests: the other one measures


def test_a_job_whose_phone_heats_mid_job_rests_it_and_keeps_its_measurements_unverified(
        tmp_path):
    """The embedded farm's first phone heats a few seconds into the job (phone_heat_after_s):
    the round finds it hot, rests it, the other phone measures on, the job succeeds; the job's
    summary and report say which phone was hot; what the hot phone measured since its last
    cool reading is in the store unverified (source hot:<phone>), and no task's best is."""
    import csv
    import json

    from tests.faults.conftest import tiny_model
    from tests.helpers import run_farm

    toml = tmp_path / "farm.toml"
    toml.write_text("[profiles.cpu-local]\nheat_check_s = 1\nheat_share = 1.5\n"
                    "heat_rest_s = 600\n")
    env = {"FARM_CONFIG": str(toml), "FARM_PHONE_HEAT_AFTER_S": "3"}
    model, out, home = tiny_model(tmp_path / "mlp.pt2", width=44), tmp_path / "out", tmp_path / "h"
    proc = run_farm(["submit", str(model), "--trials-per-task", "16", "--out", str(out)], home,
                    timeout_s=600, env=env)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    summary = json.loads((out / "summary.json").read_text())
    phones = summary["phones"]
    hot = [p for p in phones if p["hot"]]
    assert len(hot) == 1 and len(phones) == 2, phones
    report = (out / "report.html").read_text()
    assert f"{hot[0]['phone']} ({hot[0]['worker']})" in report and ", hot " in report
    exported = run_farm(["cache", "export", "--format", "csv", str(tmp_path / "csv")], home,
                        timeout_s=300, env=env)
    assert exported.returncode == 0, exported.stderr[-2000:]
    with open(tmp_path / "csv" / "measurements.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    doubted = [r for r in rows if r["source"] == f"hot:{hot[0]['phone']}"]
    assert doubted and all(r["verified"] == "False" for r in doubted), rows
    best = {}
    for r in rows:
        if r["verified"] == "True" and r["valid"] == "True":
            wk = r["workload_key"]
            if wk not in best or float(r["run_us"]) < float(best[wk]["run_us"]):
                best[wk] = r
    for task in summary["tasks"]:
        assert task["best_us"] == pytest.approx(float(best[task["workload_key"]]["run_us"]),
                                                abs=1e-3), task  # summary.json: 3 decimals
    # each measurement names the phone that timed it: the hot phone's doubted ones it, and
    # every measurement of the job one of the job's two phones
    names = {p["phone"] for p in phones}
    assert all(r["phone"] == hot[0]["phone"] for r in doubted), doubted
    assert {r["phone"] for r in rows if r["valid"] == "True"} <= names, rows
    # the same table as parquet, typed: what pandas reads without parsing text
    exported = run_farm(["cache", "export", "--format", "parquet", str(tmp_path / "pq")], home,
                        timeout_s=300, env=env)
    assert exported.returncode == 0, exported.stderr[-2000:]
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "pq" / "measurements.parquet").to_pylist()
    assert len(table) == len(rows)
    assert sorted((r["candidate"], r["phone"], r["verified"]) for r in table) == sorted(
        (r["candidate"], r["phone"], r["verified"] == "True") for r in rows)
