"""A helper host's half of a lent round: it searches and builds, the phone host measures.

A phone host short of cores lends the search and builds of a round to a helper host (`farm
worker --helper`: cores, no phones) through a search session (farm/store/sessions.py;
the phone host's side: workers/round/lend/phone_side.py). The helper runs the round's own loop
(workers/round/loop.py) with the same store-aware search, cost model and builder a
phone host would, a batch ahead of the phones; only where a batch is measured differs
(`ToPhoneHost`): each built batch goes to the phone host, the candidates' records and their
built kernels inside, and the loop waits for its measurements to come back. The phone host
commits the records; the helper commits nothing.

On the wire (zlib-compressed JSON): a batch {"index", "builder" (who built it: its host, TVM
and compilers, workers/metaschedule/identity.py), "items": [{"record", "lib" (base64 of the built
kernel), "name"} or {"record", "error"}]}, the last item of the session {"end",
"counts", "error", "ranked_by", "cpu"}; results {"index", "results": [{"secs": [...]} or {"error": msg}]}.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import logging
import os
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from tvm.s_tir.meta_schedule.builder import BuilderResult
from tvm.s_tir.meta_schedule.runner import RunnerResult

from farm.core.aliases import JsonDict, MeasureCandidate
from farm.core.config import FarmConfig
from farm.core.errors import TuneError
from farm.core.messages import RoundRequest
from farm.devices.cross import check_triple
from farm.store.sessions import SearchSessions
from farm.store.store import ModelStore
from workers.metaschedule.identity import BuildIdentity, this_host
from workers.metaschedule.search import TunedWorkload
from workers.round.context import WorkerContext
from workers.round.tuning import Where, Workload, search_round

log = logging.getLogger(__name__)
BEAT_S = 2.0  # how often each side of a session beats


def session_ttl(config: FarmConfig) -> float:
    """How long a side's beat lasts: a third of a host's TTL, and three beats at least."""
    return max(3 * BEAT_S, float(config.host_ttl_s) / 3)


class SessionEnded(TuneError):
    """The other side closed the session or stopped beating: this side stops."""


def pack(obj: JsonDict) -> bytes:
    return zlib.compress(json.dumps(obj).encode())


def unpack(blob: bytes) -> JsonDict:
    got = json.loads(zlib.decompress(blob))
    if not isinstance(got, dict):
        raise ValueError("a search session's item is not a JSON object")
    return got


def batch_blob(index: int, records: list[object], built: list[BuilderResult],
               builder: BuildIdentity) -> bytes:
    """A built batch for the phone host: who built it, each candidate's record, its kernel or
    build error."""
    items: list[JsonDict] = []
    for rec, b in zip(records, built, strict=True):
        if b.error_msg is not None or b.artifact_path is None:
            items.append({"record": rec, "error": str(b.error_msg or "no artifact")})
            continue
        with open(str(b.artifact_path), "rb") as f:
            lib = base64.b64encode(f.read()).decode()
        items.append({"record": rec, "name": os.path.basename(str(b.artifact_path)), "lib": lib})
    return pack({"index": index, "builder": builder.to_json(), "items": items})


def results_blob(index: int, results: list[RunnerResult]) -> bytes:
    return pack({"index": index, "results": [
        {"error": str(r.error_msg)} if r.error_msg is not None
        else {"secs": [float(s) for s in (r.run_secs or [])]} for r in results]})


def runner_results(got: JsonDict) -> list[RunnerResult]:
    return [RunnerResult(None, str(r["error"])) if "error" in r
            else RunnerResult([float(s) for s in r["secs"]], None) for r in got["results"]]


@contextlib.contextmanager
def beating(sessions: SearchSessions, sid: str, side: str, name: str,
            ttl_s: float) -> Iterator[None]:
    """`side` of the session beats every BEAT_S while the block runs."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(BEAT_S):
            try:
                sessions.beat(sid, side, name, ttl_s)
            except Exception as e:  # noqa: BLE001 - the other side waits out a missed beat
                log.warning("search session %s: %s beat failed: %s", sid, side, e)

    sessions.beat(sid, side, name, ttl_s)
    thread = threading.Thread(target=run, daemon=True, name=f"beat-{side}-{sid}")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


@dataclass
class ToPhoneHost:
    """The helper's `Measure` (workers/round/loop.py): a built batch goes to the phone
    host; each candidate's result is waited for (in order: the loop joins the oldest batch)."""

    sessions: SearchSessions
    sid: str
    tuned: TunedWorkload
    builder: BuildIdentity
    sent: int = 0
    _got: dict[int, list[RunnerResult]] = field(default_factory=dict)

    def send(self, cands: list[MeasureCandidate], built: list[BuilderResult],
             device: str) -> list[Callable[[], RunnerResult]]:
        index, self.sent = self.sent, self.sent + 1
        blob = batch_blob(index, [self.tuned.record(c) for c in cands], built, self.builder)
        if not self.sessions.push(self.sid, "batches", blob):
            raise SessionEnded(f"the phone host ended the session: {self._why()}")
        return [functools.partial(self._result, index, i) for i in range(len(cands))]

    def client_cpu_s(self) -> float:
        return 0.0  # the phone host's measuring client is the phone host's CPU

    def _why(self) -> str:
        return self.sessions.closed(self.sid) or "its beat stopped"

    def _result(self, index: int, i: int) -> RunnerResult:
        while index not in self._got:
            blob = self.sessions.pop(self.sid, "results", BEAT_S)
            if blob is not None:
                got = unpack(blob)
                self._got[int(got["index"])] = runner_results(got)
                continue
            if self.sessions.closed(self.sid) is not None \
                    or self.sessions.holder(self.sid, "owner") is None:
                raise SessionEnded(f"the phone host ended the session: {self._why()}")
        return self._got[index][i]


def serve_session(ctx: WorkerContext, store: ModelStore, payload: JsonDict) -> JsonDict:
    """The helper's task: claim the session, search and build the round's batches, measured
    by the phone host; the last item says how the search ended."""
    sid = str(payload["session"])
    req = RoundRequest.from_json(payload["round"])  # type: ignore[arg-type]
    sessions = SearchSessions(str(ctx.config.store_url))
    ttl_s = session_ttl(ctx.config)
    if not sessions.claim(sid, ctx.host, ttl_s):
        return {"skipped": f"session {sid} is taken or closed"}
    other = _other_tvm(ctx.host, payload)
    if other is not None:  # the phone host would refuse every batch: build none
        log.warning("helper %s: session %s: %s", ctx.host, sid, other)
        sessions.push(sid, "batches", pack({"end": True, "counts": {}, "error": other}))
        return {"refused": other}
    log.info("helper %s: searching round %s of %s for the phone host %s", ctx.host,
             req.round_index + 1, req.task_name, sessions.holder(sid, "owner"))
    with beating(sessions, sid, "helper", ctx.host, ttl_s):
        try:
            counts, ranked_by, cpu = _search(ctx, store, sessions, sid, req,
                                             int(payload["trials"]))
        except SessionEnded as e:
            log.info("helper %s: session %s: %s", ctx.host, sid, e)
            return {"ended": str(e)}
        except Exception as e:
            log.exception("helper %s: the search of session %s failed", ctx.host, sid)
            sessions.push(sid, "batches", pack({"end": True, "counts": {},
                                                "error": f"{type(e).__name__}: {e}"}))
            return {"failed": str(e)}
        sessions.push(sid, "batches", pack({"end": True, "counts": counts, "error": None,
                                            "ranked_by": ranked_by, "cpu": cpu}))
    return {"session": sid, "counts": counts}


def _other_tvm(host: str, payload: JsonDict) -> str | None:
    """Why this helper builds nothing for a session: the phone host runs another TVM (its
    payload's "tvm"; None: the same, or it did not say)."""
    import tvm

    theirs = payload.get("tvm")
    if theirs is None or theirs == tvm.__version__:
        return None
    return f"helper {host} runs TVM {tvm.__version__}, the phone host TVM {theirs}"


def _search(ctx: WorkerContext, store: ModelStore, sessions: SearchSessions, sid: str,
            req: RoundRequest, trials: int) -> tuple[dict[str, int], str, dict[str, float]]:
    """The round's search (workers/round/tuning.py), its batches measured by the phone host,
    which commits the records and hands off; the search's counts, what ranked it and the CPU
    seconds of its parts here."""

    task = store.get_workload(req.workload_key)
    if task is None:
        raise TuneError("the workload is not in the store", subject=f"workload {req.workload_key}")
    profile = ctx.profile(req.device_key)
    if profile.export == "cross":  # a compiler this helper lacks fails every build: say so
        check_triple(profile)
    w = Workload.load(store, task)
    where = Where(ToPhoneHost(sessions, sid, w.tuned, this_host(ctx.host, profile)),
                  lambda *_: None, None, ahead=True)
    facts, counts, cpu = search_round(ctx, store, req, task, w, trials, where)
    return counts, facts.ranked_by, cpu
