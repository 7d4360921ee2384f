"""The runner's phone hooks on a real tracker with real phones: every session names its phone;
a phone lost too often is set aside and the sessions go to the others, until it comes back;
when every phone is set aside, they are used; a phone's cool-down between measurements is
honoured and not counted as busy."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from farm.devices.tracker import phones as tracker_phones
from farm.devices.tracker import wait_for_phones
from farm.local import services
from farm.store import open_store
from farm.store.phones import PhoneSpan
from workers.metaschedule import phonelog
from workers.metaschedule.phonelog import LostPolicy, PhoneLog

pytestmark = pytest.mark.integration
KEY = "flaky"


@pytest.fixture(scope="module")
def tracker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    logs = tmp_path_factory.mktemp("phones")
    group = services.ServiceGroup()
    try:
        svc, addr = services.start_tracker(logs)
        group.add(svc)
        for i in range(2):
            group.add(services.start_phone(addr, KEY, i, logs))
        wait_for_phones(addr, KEY, 2, 60)
        yield addr
    finally:
        group.stop()


def sessions(tracker: str, path: Path, n: int, cooldown_s: float = 0.0) -> list[str]:
    """n measurement sessions one after another, as the runner's pool makes them."""
    from tvm.s_tir.meta_schedule.runner import RPCConfig

    host, port = tracker.split(":")
    cfg = RPCConfig(tracker_host=host, tracker_port=int(port), tracker_key=KEY,
                    session_priority=1, session_timeout_sec=30)
    got = []
    for _ in range(n):
        session = phonelog.create_session(str(path), tracker, cooldown_s, cfg)
        got.append(phonelog._SESSION.phone)
        session.cpu(0)  # the phone answers
        phonelog.cleanup(str(path), session, None)
        del session  # the session ends (the runner's pool function returns)
    return got


def lost(phone: str, at: float) -> PhoneSpan:
    return PhoneSpan(phone=phone, key=KEY, worker="w", job_id="j", workload_key="wk",
                     task="t", batch="b", start=at - 1, end=at, outcome="device_lost")


def test_a_phone_lost_too_often_is_set_aside_then_rejoins(tracker, tmp_path):
    store = open_store("memory://")
    path = tmp_path / "phones.jsonl"
    log = PhoneLog(str(path), deadline_s=10, tracker=tracker, key=KEY,
                   policy=LostPolicy(limit=2, window_s=60, aside_s=4))
    flaky, good = tracker_phones(tracker)[KEY].phones
    log.commit(store, [lost(flaky, time.time())])
    assert log.refresh(store) == {}  # once is not too often
    log.commit(store, [lost(flaky, time.time())])
    aside = log.refresh(store)
    assert set(aside) == {flaky}
    used = sessions(tracker, path, 4)
    assert used == [good] * 4, used  # pulled by the phone that is not set aside
    spans = log.spans([], [], key=KEY, worker="w", job_id="j", workload_key="wk", task="t",
                      batch="b")
    assert [s.phone for s in spans] == [good] * 4 and all(s.seconds > 0 for s in spans)
    time.sleep(max(0.0, aside[flaky] - time.time()))
    assert log.refresh(store) == {}
    deadline = time.monotonic() + 60  # the skipped phone re-registers at the tracker (~6 s)
    while flaky not in (seen := sessions(tracker, path, 2)) and time.monotonic() < deadline:
        time.sleep(1)
    assert flaky in seen  # back in service


def test_when_every_phone_is_set_aside_they_are_used(tracker, tmp_path):
    store = open_store("memory://")
    log = PhoneLog(str(tmp_path / "phones.jsonl"), deadline_s=10, tracker=tracker, key=KEY,
                   policy=LostPolicy(limit=1, window_s=60, aside_s=600))
    log.commit(store, [lost(p, time.time()) for p in tracker_phones(tracker)[KEY].phones])
    assert all(s.aside_until > time.time() for s in store.phone_stats())
    assert log.refresh(store) == {}


def test_a_phone_cools_down_between_measurements_and_cooling_is_not_busy(tracker, tmp_path):
    path = tmp_path / "phones.jsonl"
    log = PhoneLog(str(path), deadline_s=30, tracker=tracker, key=KEY)
    used = sessions(tracker, path, 4, cooldown_s=1.5)
    spans = log.spans([], [], key=KEY, worker="w", job_id="j", workload_key="wk", task="t",
                      batch="b")
    per_phone = {p: sorted((s for s in spans if s.phone == p), key=lambda s: s.start)
                 for p in set(used)}
    for mine in per_phone.values():
        for a, b in zip(mine, mine[1:], strict=False):
            assert b.start - a.end >= 1.4, (a, b)  # the phone rested between its sessions
    assert len(spans) == 4 and all(s.seconds < 1.0 for s in spans), spans  # resting is not busy


def test_a_phone_whose_kernel_crashes_serves_the_next_session(tracker, tmp_path):
    """A candidate that segfaults ends its session, not the phone (farm/devices/rpcd.py): before,
    TVM's server stopped listening and the embedded farm ended the job when the phone exited."""
    from tvm import rpc

    from tests.helpers import crash_a_session

    host, port = tracker.split(":")
    crash_a_session(rpc.connect_tracker(host, int(port)).request(KEY, session_timeout=30),
                    tmp_path)
    path, seen = tmp_path / "phones.jsonl", set()
    deadline = time.monotonic() + 60  # the crashed phone re-registers at the tracker
    while len(seen) < 2 and time.monotonic() < deadline:
        seen |= set(sessions(tracker, path, 2))
        time.sleep(0.5)
    assert seen == set(tracker_phones(tracker)[KEY].phones) and len(seen) == 2, seen


def test_integer_arguments_are_valid_indices_on_the_phone(tracker, tmp_path):
    """An embedding's `take` measured as the runner measures it (farm/devices/evaluate.py, on
    a runtime-only phone): integer tensors are zeros, floats random, filled on the host. TVM's own fill wrote float bit patterns into int64
    token ids (~4.6e18), and the kernel read out of bounds: the phone's session crashed
    (checked: "code=kShutdown" with TVM's fill)."""
    import numpy as np
    import tvm
    from tvm import rpc, te, topi

    from farm.devices.evaluate import alloc_on_phone

    table = te.placeholder((100, 8), name="table")
    ids = te.placeholder((2, 12), dtype="int64", name="ids")
    out = topi.take(table, ids, axis=0, mode="fast")  # no bounds check, as Relax's take
    lib = tmp_path / "take.so"
    tvm.compile(te.create_prim_func([table, ids, out]), target="llvm").export_library(str(lib))
    host, port = tracker.split(":")
    remote = rpc.connect_tracker(host, int(port)).request(KEY, session_timeout=30)
    remote.upload(str(lib))
    take = remote.load_module("take.so")["main"]
    args_info = [["TENSOR", "float32", [100, 8]], ["TENSOR", "int64", [2, 12]],
                 ["TENSOR", "float32", [2, 12, 8]]]
    (args,) = alloc_on_phone(remote, remote.cpu(0), args_info, 1)
    assert np.abs(args[0].numpy()).max() > 0  # the table: random
    take(*args)
    np.testing.assert_array_equal(args[2].numpy(), np.broadcast_to(args[0].numpy()[0], (2, 12, 8)))


def test_an_older_batch_gets_the_phones_before_a_younger_one(tracker, tmp_path):
    """Two rounds' batches on the same phones are served one after the other, the older first
    (workers/metaschedule/turns.py): side by side, both would end together and both rounds would then
    search while every phone waits. Without the turns, the younger batch's requests, queued
    at the tracker, take each phone the older batch frees; counting the older batch's
    measurements when they asked rather than when granted, its last request could lose a
    phone to the younger one's first (a clean-clone run of 2026-12-05)."""
    import concurrent.futures
    import threading

    from farm.devices.tracker import request_session
    from workers.metaschedule.turns import Turns, settle

    order: list[str] = []
    lock = threading.Lock()

    def measure(name: str, turns: Turns, ticket: str, ask_s: float) -> None:
        turns.wait(ticket)  # as the runner's pool does before a call (workers/metaschedule/procs.py)
        try:
            time.sleep(ask_s)  # a request takes a while to reach the tracker (a helper process)
            session, _phone = request_session(tracker, KEY, 30, turns.priority)
            settle(ticket)  # as phonelog.create_session does once the tracker grants a phone
            with lock:
                order.append(name)
            session.cpu(0)
            time.sleep(0.3)  # the phone runs the candidate
            del session
        finally:
            turns.returned(ticket)  # and after the call

    def batch(name: str, n: int, ask_s: float) -> None:
        turns = Turns(tracker, KEY, stale_s=60, root=str(tmp_path / "queue"))
        ticket = turns.start(n)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:  # a runner of 2 phones
            list(pool.map(lambda _: measure(name, turns, ticket, ask_s), range(n)))

    with concurrent.futures.ThreadPoolExecutor(2) as rounds:
        older = rounds.submit(batch, "older", 6, 0.3)  # its requests the slower to arrive
        time.sleep(0.5)  # the younger batch comes while the older one holds both phones
        younger = rounds.submit(batch, "younger", 6, 0.0)
        older.result(timeout=120)
        younger.result(timeout=120)
    assert order == ["older"] * 6 + ["younger"] * 6, order


def test_an_emulated_phone_holds_tvms_runtime_only(tracker, tmp_path):
    """Like a real phone's RPC app: TVM's runtime library is loaded, its compiler is not (a
    candidate must come linked: workers link it, farm/devices/cross.py)."""
    phone = services.start_phone(tracker, "runtime-only", 0, tmp_path)
    try:
        wait_for_phones(tracker, "runtime-only", 1, 60)
        maps = Path(f"/proc/{phone.pid}/maps").read_text()
        assert "libtvm_runtime.so" in maps and "libtvm_compiler.so" not in maps
    finally:
        phone.stop()


def test_phones_and_trackers_hold_no_secret_of_the_farm(tmp_path, monkeypatch):
    """Anyone who reaches a phone's port runs code in it (it loads what a session uploads): the
    farm's passwords and broker URLs never reach a phone's or a tracker's environment."""
    secret = "s3cr3t-pw"
    monkeypatch.setenv("FARM_REDIS_PASSWORD", secret)
    monkeypatch.setenv("FARM_BROKER_URL", f"redis://:{secret}@127.0.0.1:6399/0")
    monkeypatch.setenv("FARM_FLOWER_AUTH", f"lab:{secret}")
    group = services.ServiceGroup()
    try:
        svc, addr = services.start_tracker(tmp_path)
        group.add(svc)
        phone = group.add(services.start_phone(addr, "no-secret", 0, tmp_path))
        wait_for_phones(addr, "no-secret", 1, 60)
        for pid in (svc.pid, phone.pid):
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            assert secret.encode() not in environ and b"FARM_" not in environ, pid
            assert b"TVM_USE_RUNTIME_LIB=1" in environ or pid == svc.pid
    finally:
        group.stop()


def test_a_phone_sees_neither_the_farms_home_nor_its_other_processes(tracker, tmp_path,
                                                                     monkeypatch):
    """Code run in a phone (anyone who reaches it runs code there) finds the farm's home
    (running.json: the embedded Redis password) covered, the secret files covered, and no
    other process of the machine (its /proc environs) in sight (farm/core/confine.py)."""
    import os

    home = tmp_path / "home"
    home.mkdir()
    (home / "running.json").write_text('{"redis_password": "pw"}')
    secret_file = tmp_path / "pw"
    secret_file.write_text("pw")
    monkeypatch.setenv("FARM_HOME", str(home))
    monkeypatch.setenv("FARM_REDIS_PASSWORD_FILE", str(secret_file))
    phone = services.start_phone(tracker, "confined", 0, tmp_path / "logs")
    try:
        wait_for_phones(tracker, "confined", 1, 60)
        seen = f"/proc/{phone.pid}/root"  # the phone's view of the files, through its mounts
        assert os.listdir(f"{seen}{home}") == []
        assert Path(f"{seen}{secret_file}").read_text() == ""
        assert os.readlink(f"/proc/{phone.pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
        assert str(os.getpid()) not in os.listdir(f"{seen}/proc")
    finally:
        phone.stop()


def test_each_session_gets_the_profiles_threads_and_cores(tracker, tmp_path):
    """A phone whose runtime may use both cores of this machine (a real phone's uses all of its
    cores); each session the runner opens sets the profile's thread pool on it (TVM's
    runtime.config_threadpool over RPC: threads, big or little cores), as the farm cannot
    start a real phone's RPC app with an environment."""
    from tvm.s_tir.meta_schedule.runner import RPCConfig

    from farm.core.profiles import resolve_profile
    from farm.devices.evaluate import session_threads

    group = services.ServiceGroup()
    try:
        group.add(services.start_phone(tracker, "wide", 0, tmp_path,
                                       services.PhoneOptions(threads=2)))
        wait_for_phones(tracker, "wide", 1, 60)
        host, port = tracker.split(":")
        cfg = RPCConfig(tracker_host=host, tracker_port=int(port), tracker_key="wide",
                        session_priority=1, session_timeout_sec=30)
        log = str(tmp_path / "p.jsonl")
        bare = phonelog.create_session(log, tracker, 0.0, cfg)
        assert bare.get_function("runtime.NumThreads")() == 2  # the phone's own
        phonelog.cleanup(log, bare, None)
        del bare  # the session ends: the phone is free for the next (else it waits 30 s)
        for threads, affinity in ((1, ""), (1, "big"), (1, "little"), (2, "")):
            profile = resolve_profile("wide", {"wide": {"threads": threads,
                                                        "affinity": affinity}})
            session = phonelog.create_session(log, tracker, 0.0, cfg,
                                              threads=session_threads(profile))
            assert session.get_function("runtime.NumThreads")() == threads, (threads, affinity)
            phonelog.cleanup(log, session, None)
            del session
    finally:
        group.stop()


def test_a_rounds_cpu_account_adds_up_to_what_its_processes_spent(tracker, tmp_path):
    """A round's loop on real phones, its builds and measuring client on the round's helper
    processes (workers/metaschedule/procs.py), as a worker runs it: the CPU seconds it puts on each
    part (workers/round/loop.py) add up, within 10 % and 0.5 s, to what the kernel says
    this process and the helper processes spent meanwhile."""
    import functools

    import psutil
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from farm.core.messages import TuneTask
    from farm.core.profiles import resolve_profile
    from farm.devices.cross import export_shared
    from farm.devices.intrinsics import load_for
    from tests.helpers import tvm_children_without_torch
    from tests.unit.test_cache import matmul_mod
    from workers.metaschedule.builder import WarmBuilder
    from workers.metaschedule.callback import Provenance, RoundCounters, StoreCallback
    from workers.metaschedule.database import StoreDatabase
    from workers.metaschedule.procs import for_rounds
    from workers.metaschedule.runner import BoundedRPCRunner
    from workers.metaschedule.search import SearchPlan, StoreAwareSearch, TunedWorkload
    from workers.round.loop import PARTS, Loop, OnPhones

    load_for("llvm")
    store = open_store("memory://")
    mod, target = matmul_mod(48), tvm.target.Target({"kind": "llvm", "num-cores": 1})
    store.put_workload(TuneTask(name="mm", workload_key="wk", weight=1,
                                mod_json=tvm.ir.save_json(mod), target={"kind": "llvm"},
                                device_key=KEY))
    profile = resolve_profile(KEY, {KEY: {"threads": 1}})
    processes = for_rounds(max_uses=1000)  # none recycled: a killed process's CPU is gone
    me = psutil.Process()
    before = sum(me.cpu_times()[:2])
    with tvm_children_without_torch():
        builder = WarmBuilder(1, 60, 1000, functools.partial(export_shared, None), processes)
        runner = BoundedRPCRunner(tracker, profile, max_workers=2, run_timeout_s=30,
                                  processes=processes)
        try:
            database = StoreDatabase(store, "wk", mod)
            tuned = TunedWorkload("wk", database.workload, target)
            ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply",
                                 search_strategy=StoreAwareSearch(store, tuned, SearchPlan()),
                                 task_name="mm", rand_state=3, num_threads=1)
            counters = RoundCounters()
            loop = Loop(ctx, builder, OnPhones(runner),
                        ms.CostModel.create("xgb", num_tuning_cores=1),
                        StoreCallback(store, tuned, Provenance("j", "here", KEY), counters))
            loop.run(max_trials=32, per_batch=16, database=database)
            helpers = [psutil.Process(w._proc.pid) for w in processes._all]
            spent = sum(me.cpu_times()[:2]) - before + sum(sum(p.cpu_times()[:4])
                                                           for p in helpers)
        finally:
            runner.pool.shutdown()
            builder.shutdown()
            processes.shutdown()
    assert counters.valid >= 16 and set(loop.cpu) == set(PARTS)
    accounted = sum(loop.cpu.values())
    assert abs(accounted - spent) <= 0.1 * spent + 0.5, (loop.cpu, spent)
    # the builds (in the helper processes) and the search (in this one) are both there
    assert loop.cpu["build"] > 0.5 and loop.cpu["search"] > 0.5 and loop.cpu["phones"] > 0
