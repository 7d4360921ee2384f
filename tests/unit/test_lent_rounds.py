"""A lent round on the phone host's side (workers/round/lend/phone_side.py `lend`) on a real Redis, with
a scripted helper (claims the session, beats, pushes batches as workers/round/lend/helper_side.py does)
and phones that count what they are sent: who built a batch and whether it is measured, the
deadline per batch, the workload's lease while the round waits for its helper."""

from __future__ import annotations

import base64
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import pytest

from farm.core.config import load_config
from farm.core.messages import RoundRequest, TuneTask
from farm.store import StoredRecord, TaskState, open_store
from farm.store.sessions import SearchSessions
from tests.unit.test_cache import matmul_mod

HELPER = "farm@helper"
JOB = "job-lent"


@pytest.fixture(autouse=True, scope="module")
def cpu_intrinsics():
    from farm.devices.intrinsics import load_for

    load_for("llvm")


class Phones:
    """A runner that measures every kernel in 10 us and counts the batches it is sent."""

    def __init__(self):
        self.batches: list[int] = []

    def run(self, inputs):
        from tvm.s_tir.meta_schedule.runner import RunnerResult

        self.batches.append(len(inputs))
        out = []
        for _ in inputs:
            f: Future = Future()
            f.set_result(RunnerResult([1e-5], None))
            out.append(f)
        return out


@dataclass
class Script:
    """What the scripted helper does: waits `silent_s` after its claim (and probes the
    workload's lease then), pushes `batches` batches built by `builder`, then ends (unless
    `hang`: it beats on and sends nothing)."""

    builder: dict | None
    records: list
    batches: int = 1
    silent_s: float = 0.0
    hang: bool = False
    lease_then: list = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)


class App:
    """The phone host's Celery app: its search task runs the scripted helper in a thread."""

    def __init__(self, url: str, script: Script, store):
        self.url, self.script, self.store = url, script, store
        self.threads: list[threading.Thread] = []

    def send_task(self, name, args, queue, task_id):
        t = threading.Thread(target=self._helper, args=(args[0],), daemon=True)
        t.start()
        self.threads.append(t)

    def _helper(self, payload):
        from workers.round.lend.helper_side import beating, pack

        s, sc = SearchSessions(self.url), self.script
        sid = payload["session"]
        wk = payload["round"]["workload_key"]
        assert s.claim(sid, HELPER, 3)
        with beating(s, sid, "helper", HELPER, 3):
            if sc.silent_s:
                sc.stop.wait(sc.silent_s)
                sc.lease_then.append(self.store.acquire_lease(wk, "another-job", 1))
            if sc.hang:
                sc.stop.wait(60)
                return
            for i in range(sc.batches):
                item = {"record": sc.records[i], "name": "candidate.so",
                        "lib": base64.b64encode(b"\x7fELF not a kernel").decode()}
                blob = {"index": i, "items": [item]}
                if sc.builder is not None:
                    blob["builder"] = sc.builder
                if not s.push(sid, "batches", pack(blob)):
                    return
                while s.pop(sid, "results", 1) is None:
                    if s.closed(sid) is not None or sc.stop.is_set():
                        return
            s.push(sid, "batches", pack({"end": True, "counts": {"fresh": sc.batches},
                                         "error": None, "ranked_by": "xgb"}))


@dataclass
class Lab:
    url: str
    store: object
    wk: str
    tuned: object
    records: list


@pytest.fixture
def lab(clean_redis):
    import tvm
    import tvm_ffi
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

    from farm.core.profiles import resolve_profile
    from farm.pipeline.extract import workload_key
    from workers.metaschedule.search import TunedWorkload

    store = open_store(clean_redis)
    profile = resolve_profile("cpu-local")
    mod = matmul_mod(16)
    target = tvm.target.Target(profile.target_json())
    wk = workload_key(tvm_ffi.structural_hash(mod), profile.target_json(), profile.key)
    store.put_workload(TuneTask(name="matmul16", workload_key=wk, weight=1,
                                mod_json=tvm.ir.save_json(mod), target=profile.target_json(),
                                device_key=profile.key))
    records = []
    for factor in (2, 4, 8):
        sch = Schedule(mod)
        sch.split(sch.get_loops(sch.get_sblock("C"))[0], factors=[None, factor])
        records.append(TuningRecord(sch.trace, Workload(mod), None, target,
                                    ArgInfo.from_prim_func(mod["main"])).as_json())
    yield Lab(clean_redis, store, wk, TunedWorkload(wk, Workload(mod), target), records)
    store.close()


def run_lent(lab: Lab, script: Script, deadline_s: float = 180, wait_s: float = 30,
             app_type: type[App] = App):
    """The phone host lends a round to the scripted helper: (how it went or None when it did
    not return within `wait_s`, the phones)."""
    from workers.metaschedule.callback import Provenance, RoundCounters, StoreCallback
    from workers.round.context import WorkerContext
    from workers.round.lend import phone_side as phone_side
    from workers.round.rounds import Round

    config = load_config(env={"FARM_BROKER_URL": lab.url, "FARM_HOST_TTL_S": "9",
                              "FARM_LENT_BATCH_TIMEOUT_S": str(deadline_s)})
    app = app_type(lab.url, script, lab.store)
    ctx = WorkerContext(config, tracker="", host="farm@phones", app=app)
    req = RoundRequest(job_id=JOB, workload_key=lab.wk, task_name="matmul16", round_index=0,
                       trials=16, target_trials=64, max_rounds=4, device_key="cpu-local")
    rnd = Round(ctx, lab.store, req, lab.store.get_workload(lab.wk), TaskState(), 64, 16)
    phones = Phones()
    callback = StoreCallback(lab.store, lab.tuned, Provenance(JOB, ctx.host), RoundCounters())
    got: list = []
    t = threading.Thread(target=lambda: got.append(phone_side.lend(
        phone_side.LentRound(rnd, phones, callback, lab.tuned, 16), "cpu", room=-1)), daemon=True)
    t.start()
    t.join(wait_s)
    script.stop.set()  # a helper still beating stops (a lend that never returned then ends)
    return (got[0] if got else None), phones


def identity(**changed) -> dict:
    import tvm

    return {"schema": 1, "host": HELPER, "tvm": tvm.__version__, "llvm": "99",
            "linker": "aarch64-linux-gnu-g++ 12", **changed}


def test_a_lent_batch_is_measured_and_its_records_name_the_helper_that_built_it(lab):
    import tvm

    lent, phones = run_lent(lab, Script(identity(), lab.records, batches=2))
    assert lent is not None and lent.complete, lent
    assert phones.batches == [1, 1] and lent.measured == 2
    recs = lab.store.records(lab.wk)
    assert len(recs) == 2
    for rec in recs:
        assert rec.tvm == tvm.__version__ and rec.host == "farm@phones"  # measured here
        assert rec.builder == f"{HELPER}: LLVM 99, aarch64-linux-gnu-g++ 12"  # built there
    from farm.client import cache

    assert {r["builder"] for r in cache.show(lab.store, lab.wk)["top"]} == {recs[0].builder}


@pytest.mark.parametrize("builder", [identity(tvm="0.26.0"), None],
                         ids=["another-tvm", "unsaid"])
def test_a_batch_another_tvm_built_is_refused_never_measured(lab, builder):
    import tvm

    lent, phones = run_lent(lab, Script(builder, lab.records, batches=2))
    assert lent is not None and not lent.complete  # the round searches on here
    assert phones.batches == [] and lent.measured == 0  # no phone ran its kernels
    assert lab.store.records(lab.wk) == []
    assert HELPER in lent.why and "refused" in lent.why
    if builder is not None:  # both versions said
        assert "0.26.0" in lent.why and tvm.__version__ in lent.why


def test_a_helper_that_sends_nothing_past_the_deadline_loses_the_round(lab):
    t0 = time.monotonic()
    lent, phones = run_lent(lab, Script(identity(), lab.records, hang=True), deadline_s=3, wait_s=20)
    # its beat goes on: only the deadline takes the round back
    assert lent is not None, "the round waited on a helper that beats but sends nothing"
    assert time.monotonic() - t0 < 12
    assert not lent.complete and phones.batches == []
    assert HELPER in lent.why and "no batch within 3 s" in lent.why


def test_the_workload_lease_is_held_while_a_lent_round_waits_for_its_helper(lab):
    assert lab.store.acquire_lease(lab.wk, JOB, 2) is None  # as the round took it (short here)
    script = Script(identity(), lab.records, silent_s=4)
    lent, _ = run_lent(lab, script)
    assert lent is not None and lent.complete
    assert script.lease_then == [JOB]  # another job could not take it while the helper searched


def test_a_helper_of_another_tvm_builds_nothing_for_the_round(lab, monkeypatch):
    """The phone host says its TVM with the session; the helper (its real task) refuses at
    once, before any search, rather than have every batch refused."""
    import tvm

    from workers.round.context import WorkerContext
    from workers.round.lend import helper_side as helper_side
    from workers.round.lend import phone_side as phone_side

    served: list = []

    class HelperApp(App):
        def _helper(self, payload):
            config = load_config(env={"FARM_BROKER_URL": lab.url, "FARM_HOST_TTL_S": "9"})
            served.append(helper_side.serve_session(WorkerContext(config, tracker="", host=HELPER),
                                             lab.store, payload))

    monkeypatch.setattr(phone_side, "TVM_VERSION", "0.26.0", raising=False)  # the phone host's
    lent, phones = run_lent(lab, Script(identity(), lab.records), app_type=HelperApp)
    assert lent is not None and not lent.complete and phones.batches == []
    assert served and "refused" in served[0]
    assert f"helper {HELPER} runs TVM {tvm.__version__}, the phone host TVM 0.26.0" in lent.why


def test_a_build_identity_crosses_the_wire_and_compares():
    from workers.metaschedule.identity import BuildIdentity

    mine = BuildIdentity("farm@phones", "0.27.0", "22", "g++ 12")
    theirs = BuildIdentity.from_json(identity(tvm="0.27.0"))
    assert BuildIdentity.from_json(mine.to_json()) == mine
    assert mine.refuses(theirs) is None
    assert mine.differs(theirs) == ("LLVM 99 there, 22 here; linker aarch64-linux-gnu-g++ 12 "
                                    "there, g++ 12 here")
    assert "TVM 0.26.0" in str(mine.refuses(BuildIdentity.from_json(identity(tvm="0.26.0"))))
    assert mine.differs(BuildIdentity("h", "0.27.0")) is None  # unknown compilers: no claim
    for bad in (None, {"host": "h", "tvm": "0.27.0"}, {"schema": 1, "host": 3, "tvm": ""}):
        with pytest.raises(ValueError):
            BuildIdentity.from_json(bad)


def test_stored_records_keep_their_builder():
    rec = StoredRecord(workload_key="wk", candidate="c", record=[], run_us=1.0,
                       builder="farm@helper: LLVM 22, g++ 12")
    assert StoredRecord.loads(rec.dumps()) == rec
