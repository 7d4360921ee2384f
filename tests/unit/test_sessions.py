"""A round's search lent to a helper (farm/store/sessions.py, workers/round/lend/helper_side.py and
phone_side.py): the session's contract on a real Redis, the wire format, and when a phone host
lends its search."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest

from farm.store.sessions import SearchSessions


@pytest.fixture
def sessions(clean_redis: str) -> SearchSessions:
    return SearchSessions(clean_redis)


def test_one_helper_claims_a_session_and_none_a_closed_one(sessions):
    sessions.open("s1", "farm@phones", ttl_s=5)
    assert sessions.holder("s1", "owner") == "farm@phones"
    assert sessions.claim("s1", "farm@helper1", ttl_s=5)
    assert not sessions.claim("s1", "farm@helper2", ttl_s=5)  # taken
    assert sessions.holder("s1", "helper") == "farm@helper1"
    sessions.open("s2", "farm@phones", ttl_s=5)
    sessions.close("s2", "no helper took the search within 10 s")
    assert not sessions.claim("s2", "farm@helper1", ttl_s=5)  # a copy delivered late
    assert sessions.closed("s2") == "no helper took the search within 10 s"
    assert sessions.closed("s1") is None


def test_a_session_opens_only_while_the_helpers_have_room(sessions):
    a = sessions.session_id("farm@phones", "r1", "a")
    b = sessions.session_id("farm@phones", "r2", "b")
    c = sessions.session_id("farm@other", "r3", "c")
    assert sessions.open(a, "farm@phones", ttl_s=5, room=2)
    assert sessions.open(b, "farm@phones", ttl_s=1, room=2)
    assert not sessions.open(c, "farm@other", ttl_s=5, room=2)  # both helper sessions taken
    assert sessions.holder(c, "owner") is None  # refused: nothing of it written
    assert sorted(sessions.open_now()) == sorted([a, b])
    sessions.close(a, "the round ended")  # a closed session frees its room at once
    assert sessions.open_now() == [b]
    assert sessions.open(c, "farm@other", ttl_s=5, room=2)
    d = sessions.session_id("farm@other", "r4", "d")
    assert not sessions.open(d, "farm@other", ttl_s=5, room=2)
    time.sleep(1.3)  # b's owner stopped beating (killed): its room is free after its TTL
    assert sessions.open_now() == [c]
    assert sessions.open(d, "farm@other", ttl_s=5, room=2)
    sessions.beat(c, "owner", "farm@other", ttl_s=1)  # a beat keeps it open as long as it says
    assert sorted(sessions.open_now()) == sorted([c, d])
    assert sessions.open("e", "farm@x", ttl_s=5)  # no room given: no limit


def test_items_arrive_in_order_and_a_closed_session_takes_none(sessions):
    sessions.open("s", "o", ttl_s=5)
    assert sessions.push("s", "batches", b"\x00first") and sessions.push("s", "batches", b"two")
    assert sessions.pop("s", "batches", 1) == b"\x00first"  # binary kept as it is
    assert sessions.pop("s", "batches", 1) == b"two"
    t0 = time.monotonic()
    assert sessions.pop("s", "results", 1) is None  # nothing came: waited, then None
    assert time.monotonic() - t0 >= 0.9
    sessions.push("s", "results", b"late")
    sessions.close("s", "the round ended")
    assert sessions.pop("s", "results", 1) is None  # its lists went with it
    assert not sessions.push("s", "batches", b"after")


def test_a_side_that_stops_beating_is_gone_after_its_ttl(sessions):
    sessions.beat("s", "helper", "h", ttl_s=1)
    assert sessions.holder("s", "helper") == "h"
    time.sleep(1.3)
    assert sessions.holder("s", "helper") is None


def test_a_batch_and_its_results_cross_the_wire_intact(tmp_path):
    from tvm.s_tir.meta_schedule.builder import BuilderResult
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    from workers.metaschedule.identity import BuildIdentity
    from workers.round.lend.helper_side import batch_blob, results_blob, runner_results, unpack

    lib = tmp_path / "build" / "tmp.so"
    lib.parent.mkdir()
    lib.write_bytes(bytes(range(256)) * 40)
    blob = batch_blob(3, [["trace-a"], ["trace-b"]],
                      [BuilderResult(str(lib), None), BuilderResult(None, "LLVM said no")],
                      BuildIdentity("farm@helper", "0.27.0", "22", "g++ 12"))
    got = unpack(blob)
    assert got["index"] == 3 and len(blob) < lib.stat().st_size  # compressed
    assert BuildIdentity.from_json(got["builder"]) == BuildIdentity("farm@helper", "0.27.0",
                                                                    "22", "g++ 12")
    ok, failed = got["items"]
    assert ok["record"] == ["trace-a"] and ok["name"] == "tmp.so"
    import base64

    assert base64.b64decode(ok["lib"]) == lib.read_bytes()
    assert failed == {"record": ["trace-b"], "error": "LLVM said no"}
    back = runner_results(unpack(results_blob(3, [RunnerResult([1e-5, 2e-5], None),
                                                  RunnerResult(None, "timeout")])))
    assert [list(map(float, r.run_secs)) if r.run_secs else None for r in back] == [
        [1e-5, 2e-5], None]
    assert [r.error_msg for r in back] == [None, "timeout"]


@dataclass
class Beat:
    name: str
    queues: list[str] = field(default_factory=list)
    searches: int = 0


class Hosts:
    def __init__(self, beats):
        self.beats = beats

    def hosts(self):
        return self.beats


@dataclass
class Config:
    lend_search: str = "auto"
    store_url: str = ""


@dataclass
class Ctx:
    config: Config
    app: object = "app"
    gate: object = None
    tracker: str = ""
    host: str = ""


@dataclass
class Profile:
    host_cpu: bool = False
    key: str = "k"


@pytest.mark.parametrize("mode,host_cpu,helper,phones,lends", [
    ("always", False, True, 1, True),
    ("always", False, False, 16, False),  # no helper alive
    ("never", False, True, 16, False),
    ("always", True, True, 16, False),  # phones on this host's CPU never borrow
    ("auto", False, True, 16, True),  # 16 phones on a few cores
    ("auto", False, True, 3, True),  # more phones than cores
    ("auto", False, True, 2, False),  # not measured yet: a core per phone
    ("auto", False, True, 1, False),
])
def test_when_a_phone_host_lends_its_search(monkeypatch, mode, host_cpu, helper, phones, lends):
    from farm.jobs.dispatch import SEARCH_QUEUE
    from workers.round.lend import phone_side as phone_side

    monkeypatch.setattr(phone_side, "usable_cores", lambda: 2)
    store = Hosts([Beat("farm@phones", ["tune.k"])]
                  + ([Beat("farm@helper", [SEARCH_QUEUE])] if helper else []))
    why = phone_side.wanted(Ctx(Config(mode)), store, Profile(host_cpu), phones,
                        phone_side.Helpers.read(store))
    assert (why is not None) == lends, why


def test_a_lending_host_runs_a_round_more_per_helper_session_it_holds_or_is_free(
        monkeypatch, clean_redis, sessions):
    from farm.jobs.dispatch import SEARCH_QUEUE
    from workers.round.lend import phone_side as phone_side

    monkeypatch.setattr(phone_side, "usable_cores", lambda: 1)
    store = Hosts([Beat("farm@phones", ["tune.k"]), Beat("farm@h1", [SEARCH_QUEUE], 2),
                   Beat("farm@h2", [SEARCH_QUEUE], 1)])
    ctx = Ctx(Config("auto", clean_redis), host="farm@phones")
    assert phone_side.Helpers.read(store) == phone_side.Helpers(("farm@h1", "farm@h2"), 3)
    assert phone_side.lend_rounds(ctx, store, Profile(), 8) == 3  # all free
    sessions.open(sessions.session_id("farm@other", "r", "1"), "farm@other", 5, room=3)
    sessions.open(sessions.session_id("farm@other", "r", "2"), "farm@other", 5, room=3)
    assert phone_side.lend_rounds(ctx, store, Profile(), 8) == 1  # another host holds two
    sessions.open(sessions.session_id("farm@phones", "r", "3"), "farm@phones", 5, room=3)
    assert phone_side.lend_rounds(ctx, store, Profile(), 8) == 1  # its own one, none free
    assert phone_side.lend_rounds(ctx, store, Profile(), 1) == 0  # 1 phone on 1 core: not short
    assert phone_side.lend_rounds(ctx, store, Profile(host_cpu=True), 8) == 0
