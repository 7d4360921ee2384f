"""A phone host's half of a lent round: a helper host searches and builds, the phones measure.

A round on a host short of cores for its phones (more phones than cores: 8-16 phones on a
small host; or the gate measured it slower per batch than its phones) lends its search and
builds to a helper host (`farm worker --helper`) when one has room (`lend_search`: "auto";
"always" whenever a helper is alive; "never"). The round stays this host's: its lease, fence,
phones, records and result. It opens a search session (farm/store/sessions.py), sends the
helper's task, and measures each built batch the helper pushes, committing the records as
any round does, then pushes the results back (the helper: workers/round/lend/helper_side.py).

A helper's records are checked as stored traces are (farm/core/traces.py) before they are
measured; its kernels run on the phones (phones hold no secrets; a helper is a host of the
lab, with the broker's password). Phones emulated on this host's CPU never lend: they
share its cores, and the kernels would run on this host.

A host that lends runs more rounds of a key at once (its gate, workers/round/measure.py):
its own two, searched here, and as many more as the helpers have free sessions, lent
(`lend_rounds`); a round lends only while a helper has room (`SearchSessions.open`), else it
searches here at once rather than wait for one. So the phones are fed by both: the helpers'
cores and this host's (measured, bench/scaling.md 2026-12-06: lending every round and
searching none here was no faster with 8 phones and slower with 16, the host's core then
half idle).

If no helper takes the session within CLAIM_S, or the helper's beat stops (killed, its
machine gone), or it sends no batch within `lent_batch_timeout_s` (its search hangs while its
beat runs), or it fails, the round searches the rest of its trials here: what the helper's
batches measured is in the store, so nothing is measured twice. A batch of which the helper
built nothing is the helper's fault (no compiler for the profile), not the kernels': it is not
stored, and the round goes on here. So is a batch another TVM version built (each batch says
who built it: workers/metaschedule/identity.py), refused before it reaches a phone; a batch other
compilers built is measured, its records stamped with the helper's identity. The workload's
lease (workers/round/measure.py) is renewed while the round waits for the helper's batches.
"""

from __future__ import annotations

import base64
import functools
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tvm import __version__ as TVM_VERSION
from tvm.s_tir.meta_schedule.builder import BuilderResult
from tvm.s_tir.meta_schedule.runner import RunnerResult

from farm.core.aliases import JsonDict, MeasureCandidate
from farm.core.cores import usable_cores
from farm.core.errors import ServiceError
from farm.core.profiles import DeviceProfile
from farm.devices import tracker as tracker_mod
from farm.jobs.dispatch import SEARCH_QUEUE, SEARCH_TASK
from farm.store.hosts import HostRegistry
from farm.store.sessions import SearchSessions
from farm.store.store import FarmView
from farm.tir.module import tuning_record as tir_tuning_record
from workers.metaschedule.identity import BuildIdentity, this_host
from workers.round.context import WorkerContext
from workers.round.gate import phone_speed
from workers.round.lend.helper_side import BEAT_S, beating, results_blob, session_ttl, unpack
from workers.round.loop import BATCH, OnPhones
from workers.round.rounds import LEASE_TTL_S, Round

if TYPE_CHECKING:
    from workers.metaschedule.callback import StoreCallback
    from workers.metaschedule.runner import BoundedRPCRunner
    from workers.metaschedule.search import TunedWorkload

log = logging.getLogger(__name__)
CLAIM_S = 10.0  # how long a round waits for a helper to take its session


@dataclass(frozen=True)
class Helpers:
    """The live helper hosts (their heartbeats say they consume the search queue) and the
    search sessions they serve at once, together."""

    names: tuple[str, ...]
    room: int

    @classmethod
    def read(cls, store: HostRegistry) -> Helpers:
        beats = [h for h in store.hosts() if SEARCH_QUEUE in h.queues]
        return cls(tuple(sorted(h.name for h in beats)), sum(max(0, h.searches) for h in beats))


def lend_rounds(ctx: WorkerContext, store: FarmView, profile: DeviceProfile, phones: int,
                phone_s: Callable[[], float | None] | None = None) -> int:
    """Rounds of the key this host may have lent at once: its open sessions and the helpers'
    free ones (0 when its rounds do not lend). `phone_s`: the phones' measured speed, when
    the caller has read it."""
    alive = Helpers.read(store)
    if wanted(ctx, store, profile, phones, alive, phone_s) is None:
        return 0
    live = SearchSessions(str(ctx.config.store_url)).open_now()
    mine = sum(1 for sid in live if sid.startswith(f"{ctx.host}/"))
    return mine + max(0, alive.room - len(live))


def wanted(ctx: WorkerContext, store: FarmView, profile: DeviceProfile, phones: int,
           alive: Helpers, phone_s: Callable[[], float | None] | None = None) -> str | None:
    """Why this round lends its search to one of the `alive` helpers; None: it searches here.
    `phone_s`: the mean measurement time of the key's phones here (default: asked of the
    tracker and the store)."""
    mode = ctx.config.lend_search
    if mode == "never" or profile.host_cpu or ctx.app is None or not alive.names:
        return None
    if mode == "always":
        return f"lend_search = always; helpers {', '.join(alive.names)}"
    if phones > usable_cores():  # a phone per core at least: its rounds wait for the search
        return f"{phones} phones on {usable_cores()} cores"
    host_s = ctx.gate.host_s() if ctx.gate is not None else None
    if host_s is None:
        return None

    per_batch = BATCH * ((phone_s or functools.partial(_phone_s, ctx, store, profile))()
                         or 0.0) / max(1, phones)
    if host_s > per_batch > 0:
        return f"this host needs {host_s:.1f} s a batch, its {phones} phones {per_batch:.1f} s"
    return None


def _phone_s(ctx: WorkerContext, store: FarmView, profile: DeviceProfile) -> float | None:

    try:
        info = tracker_mod.phones(ctx.tracker).get(profile.key)
    except ServiceError:  # the tracker is away a moment: the round waits for it here
        return None
    return phone_speed(store, profile.key, info.phones if info is not None else ())


@dataclass
class Lent:
    """How a lent round went: `complete` (the helper's search ended; else the rest of the
    round searches here), the fresh candidates the phones measured, the search's counts and
    what ranked its candidates (the helper's cost model)."""

    complete: bool
    measured: int = 0
    counts: dict[str, int] = field(default_factory=lambda: {"skipped": 0, "fresh": 0})
    helper: str = ""
    why: str = ""
    ranked_by: str = ""
    cpu: dict[str, float] = field(default_factory=dict)  # the helper's CPU seconds per part


@dataclass
class LentRound:
    """What a lent round measures with: the round, its runner and store callback, the tuned
    workload, the trials, and the hand-off check (asked before every batch after the first)."""

    rnd: Round
    runner: BoundedRPCRunner
    callback: StoreCallback
    tuned: TunedWorkload
    trials: int
    stop: Callable[[], bool] | None = None


def lend(b: LentRound, device: str, room: int) -> Lent | None:
    """Open a session, have a helper take it, measure its batches until its search ends (or
    the helper is lost, or the round hands off). None: all `room` helper sessions are taken."""
    ctx, req = b.rnd.ctx, b.rnd.req
    sessions = SearchSessions(str(ctx.config.store_url))
    sid = sessions.session_id(ctx.host, req.round_id, uuid.uuid4().hex[:8])
    ttl_s = session_ttl(ctx.config)
    if not sessions.open(sid, ctx.host, ttl_s, room):
        return None
    assert ctx.app is not None
    ctx.app.send_task(SEARCH_TASK, args=[{"session": sid, "round": req.to_json(),
                                          "trials": b.trials, "tvm": TVM_VERSION}],
                      queue=SEARCH_QUEUE, task_id=sid)
    work_dir = tempfile.mkdtemp(prefix="farm-lent-")
    lent = Lent(complete=False)
    try:
        with beating(sessions, sid, "owner", ctx.host, ttl_s):
            _measure(b, sessions, sid, device, work_dir, lent)
    finally:
        if sessions.closed(sid) is None:
            sessions.close(sid, lent.why or "the round ended")
        shutil.rmtree(work_dir, ignore_errors=True)
    return lent


def _measure(b: LentRound, sessions: SearchSessions, sid: str, device: str, work_dir: str,
             lent: Lent) -> None:
    ctx = b.rnd.ctx
    mine = this_host(ctx.host, ctx.profile(b.rnd.req.device_key))
    deadline_s = float(ctx.config.lent_batch_timeout_s)
    claim_by = time.monotonic() + CLAIM_S
    heard: float | None = None  # the helper's last batch (or its claim, or results sent it)
    index = 0
    while True:
        _renew_lease(b)
        blob = sessions.pop(sid, "batches", BEAT_S)
        if blob is None:
            holder = sessions.holder(sid, "helper")
            if holder is None and (lent.helper or time.monotonic() > claim_by):
                lent.why = (f"helper {lent.helper} stopped beating" if lent.helper
                            else f"no helper took the search within {CLAIM_S:.0f} s")
                return
            heard = time.monotonic() if heard is None and holder is not None else heard
            lent.helper = holder or lent.helper
            if heard is not None and time.monotonic() - heard > deadline_s:
                lent.why = (f"helper {lent.helper} sent no batch within {deadline_s:.0f} s "
                            f"(lent_batch_timeout_s): the round is taken back")
                return
            continue
        heard = time.monotonic()
        got = unpack(blob)
        if got.get("end"):
            lent.complete = not got.get("error")
            lent.counts = {**lent.counts, **{k: int(v) for k, v in got["counts"].items()}}
            lent.ranked_by = str(got.get("ranked_by", ""))
            lent.cpu = {str(k): float(v) for k, v in dict(got.get("cpu") or {}).items()}
            lent.why = f"the helper's search failed: {got['error']}" if got.get("error") else ""
            return
        if index and b.stop is not None and b.stop():
            lent.complete, lent.why = True, "handed off"
            lent.counts["handed_off"] = 1
            return
        lent.helper = lent.helper or sessions.holder(sid, "helper") or ""
        theirs = _builder(got, mine, lent, index)
        if theirs is None:
            return
        items = got["items"]
        if items and all("error" in i for i in items):  # the helper's builds, not the kernels
            lent.why = (f"helper {lent.helper} built none of a batch (not stored): "
                        f"{str(items[0]['error'])[-300:]}")
            return
        results, measured = _measure_batch(b, got, device, os.path.join(work_dir, str(index)),
                                           theirs)
        lent.measured += measured
        sessions.push(sid, "results", results_blob(int(got["index"]), results))
        heard = time.monotonic()  # the phones' time is not the helper's
        index += 1


def _builder(got: JsonDict, mine: BuildIdentity, lent: Lent, index: int) -> BuildIdentity | None:
    """Who built a helper's batch, when this host measures it; None: refused (`lent.why`
    says why: another TVM built it, or it does not say who did)."""
    try:
        theirs = BuildIdentity.from_json(got.get("builder"))
    except ValueError as e:
        lent.why = (f"helper {lent.helper} did not say who built its batch (an older tunefarm?), "
                    f"refused, not measured: {e}")
        return None
    refused = mine.refuses(theirs)
    if refused is not None:
        lent.why = f"helper {lent.helper}'s batch refused, not measured: {refused}"
        return None
    differs = mine.differs(theirs) if index == 0 else None
    if differs is not None:
        log.warning("search session of %s: helper %s builds with other compilers (%s); its "
                    "records say so", mine.host, theirs.host, differs)
    return theirs


def _renew_lease(b: LentRound) -> None:
    """Renew the workload's lease while the round waits for its helper (a measured batch
    renews it too: workers/host/app.py)."""
    store, req = b.rnd.store, b.rnd.req
    try:
        holder = store.acquire_lease(req.workload_key, req.job_id, LEASE_TTL_S)
    except Exception as e:  # noqa: BLE001 - the store restarting: renewed at the next pass
        log.warning("round %s: the workload's lease not renewed: %s", req.round_id, e)
        return
    if holder is not None:
        log.warning("round %s: job %s holds the lease of workload %s now", req.round_id,
                    holder, req.workload_key)


def _measure_batch(b: LentRound, got: JsonDict, device: str, folder: str,
                   built_by: BuildIdentity) -> tuple[list[RunnerResult], int]:
    """Measure one of the helper's batches on the phones and commit it, its records stamped
    with who built them; every item's result (a record refused here: its reason, not
    measured) and how many were measured."""

    os.makedirs(folder, exist_ok=True)
    cands: list[MeasureCandidate] = []
    built: list[BuilderResult] = []
    slots: list[int | str] = []  # per item: its index in the batch measured, or why refused
    for n, item in enumerate(got["items"]):
        try:
            cand = tir_tuning_record(item["record"], b.tuned.workload).as_measure_candidate()
        except Exception as e:  # noqa: BLE001 - a record this host will not replay
            slots.append(f"refused by the phone host: {e}")
            continue
        if "error" in item:
            built.append(BuilderResult(None, str(item["error"])))
        else:
            path = os.path.join(folder, f"{n}-{os.path.basename(str(item['name']))}")
            with open(path, "wb") as f:
                f.write(base64.b64decode(item["lib"]))
            built.append(BuilderResult(path, None))
        slots.append(len(cands))
        cands.append(cand)
    results = [f() for f in OnPhones(b.runner).send(cands, built, device)] if cands else []
    if cands:
        b.callback(cands, built, results, built_by=built_by)
    shutil.rmtree(folder, ignore_errors=True)
    return [results[s] if isinstance(s, int) else RunnerResult(None, s) for s in slots], len(cands)

