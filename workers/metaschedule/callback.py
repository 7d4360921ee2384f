"""Commit every measured candidate to the store at once, with its failure class.

Replaces MetaSchedule's AddToDatabase: it sees builder and runner errors, so a
failure is classified (build, runtime, timeout); a candidate whose phone went
away (device_lost) is not stored at all, so it can be measured again, unless that
same candidate has lost a phone CULPRIT_AFTER times (over every round, host and job):
then it is stored as the culprit, a failed kernel that is never measured again.

A candidate measured on a phone found hot (workers/metaschedule/phonelog.py) is stored unverified,
as an imported record is: kept, never a best, measured again when proposed (or first, in a
later round, where it claims to beat the best). So are the round's earlier measurements on
that phone since its last cool reading (their records replaced by unverified ones).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from tvm import __version__ as TVM_VERSION

from farm.core.failures import brief
from farm.store import StoredRecord, candidate_hash
from farm.store.store import CULPRIT_AFTER, RoundCommits, valid_secs
from workers.metaschedule.runner import BoundedRPCRunner, classify_run_error
from workers.metaschedule.search import TunedWorkload

if TYPE_CHECKING:
    from tvm.s_tir.meta_schedule.builder import BuilderResult
    from tvm.s_tir.meta_schedule.runner import RunnerResult
    from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate

    from workers.metaschedule.identity import BuildIdentity

log = logging.getLogger(__name__)


@dataclass
class RoundCounters:
    new: int = 0
    valid: int = 0
    duplicates: int = 0
    device_lost: int = 0
    failures: Counter = field(default_factory=Counter)
    errors: dict[str, str] = field(default_factory=dict)  # class -> its first message, brief
    best_us: float | None = None
    last_device_error: str = ""
    store_error: Exception | None = None  # the store failed mid-round (re-raised after the loop)
    measure_s: float = 0.0  # batch sent to the phones -> all its results back, summed
    batches: int = 0
    hot: int = 0  # measurements of a hot phone: stored unverified


@dataclass(frozen=True)
class Provenance:
    """Where a round's measurements come from, as its records and its phones' spans say: the
    job and the host (the worker) that measured them, and for the spans the device key, the
    task's name and the round's id."""

    job_id: str
    host: str
    device_key: str = ""
    task: str = ""
    round_id: str = ""
    # candidate hash -> its record's source where it is not the round's search ("job"): a
    # relative's schedule carried over, "transfer:<relative>" (the search fills it)
    origins: dict[str, str] = field(default_factory=dict, compare=False)


def outcome(built: BuilderResult, ran: RunnerResult) -> tuple[str | None, str, list[float] | None]:
    """(error class, error message, run seconds) of one candidate's build and run."""
    if built.error_msg:
        return "build", built.error_msg, None
    if ran.error_msg:
        return classify_run_error(ran.error_msg), ran.error_msg, None
    run_secs = [float(s) for s in ran.run_secs]
    if not run_secs or not all(valid_secs(s) for s in run_secs):
        # a phone that reports an impossible time is not believed
        return "runtime", f"the phone reported impossible run times {run_secs[:4]}", None
    return None, "", run_secs


class StoreCallback:
    """The store's side of a measured batch (workers/round/loop.py tells it each batch):
    every candidate's record committed, classified, counted, stamped with what built it (this
    host: `built_by`; a lent batch: its helper's); which phone measured what."""

    def __init__(self, store: RoundCommits, tuned: TunedWorkload, provenance: Provenance,
                 counters: RoundCounters,
                 on_progress: Callable[[RoundCounters], None] | None = None,
                 runner: BoundedRPCRunner | None = None,
                 built_by: BuildIdentity | None = None) -> None:
        self.store = store
        self.tuned = tuned
        self.workload_key = tuned.key
        self.provenance = provenance
        self.counters = counters
        self.on_progress = on_progress
        # its `started` times the batch's measurement; its phone log, which phone measured what
        self.runner = runner
        self.built_by = built_by
        # phone -> the verified records this round measured on it since its last reading
        # (a hot reading puts them in doubt)
        self.since_read: dict[str, list[StoredRecord]] = {}

    def _device_lost(self, candidate: str, error_msg: str) -> int:
        """A run sent to a phone that went away: counted (it is not stored; a culprit is, and
        the store counts its measurement). Returns how often this candidate lost a phone."""
        c = self.counters
        try:
            lost = self.store.note_device_lost(self.workload_key, candidate)
            self.store.count_measurements(self.provenance.job_id, self.workload_key,
                                          device_lost=1,
                                          measurements=1 if lost < CULPRIT_AFTER else 0)
        except Exception as e:
            c.store_error = e
            raise
        if lost < CULPRIT_AFTER:
            c.device_lost += 1
            c.last_device_error = brief(error_msg) if error_msg else ""
            c.errors.setdefault("device_lost", c.last_device_error)
        else:
            log.warning("workload %s: candidate %s lost a phone %d times: stored as the "
                        "culprit, not measured again", self.workload_key, candidate, lost)
        return lost

    def _note_phones(self, builder_results: list[BuilderResult],
                     outcomes: list[str]) -> dict[str, str]:
        """Which phone measured each candidate of the batch, when, and how it ended. Returns
        the batch's artifacts measured on a phone found hot -> that phone, after marking the
        round's earlier measurements on it in doubt."""
        if self.runner is None:
            return {}
        log_, p = self.runner.phone_log, self.provenance
        self.counters.batches += 1
        spans = log_.spans([None if b.error_msg else b.artifact_path for b in builder_results],
                           outcomes, job_id=p.job_id, workload_key=self.workload_key,
                           worker=p.host, key=p.device_key, task=p.task,
                           batch=f"{p.round_id}#{self.counters.batches}")
        try:
            hot = log_.commit(self.store, spans)
            for phone in {r.phone for r in log_.readings}:  # read: what came before is
                if phone not in hot:  # confirmed by a cool reading
                    self.since_read.pop(phone, None)
            for phone, cool_at in hot.items():
                self._doubt([r for r in self.since_read.pop(phone, []) if r.measured_at >= cool_at],
                            phone)
        except Exception as e:
            self.counters.store_error = e
            raise
        return {a: ph for a, ph in log_.phone_of.items() if ph in hot}

    def _doubt(self, records: list[StoredRecord], phone: str) -> None:
        """Store the round's earlier measurements of a phone found hot as unverified."""
        for rec in records:
            if self.store.remove_records(self.workload_key, [rec.candidate]):
                self.store.add_record(replace(rec, verified=False, source=f"hot:{phone}"))
                self.counters.hot += 1
        if records:
            log.info("workload %s: %d earlier measurements of hot phone %s stored unverified",
                     self.workload_key, len(records), phone)

    def _count(self, stored: StoredRecord, phone: str) -> None:
        """Commit one measurement and count it (one of a hot phone is not the round's)."""
        c = self.counters
        try:
            added = self.store.add_record(stored)
        except Exception as e:
            c.store_error = e
            raise
        if not added:
            c.duplicates += 1
            return
        if not stored.verified:
            return  # measured on a hot phone: not the round's result until measured again
        c.new += 1
        if stored.error_class is None:
            c.valid += 1
            if phone:
                self.since_read.setdefault(phone, []).append(stored)
            if c.best_us is None or stored.run_us < c.best_us:  # type: ignore[operator]
                c.best_us = stored.run_us
        else:
            c.failures[stored.error_class] += 1
            c.errors.setdefault(stored.error_class, brief(stored.error_msg))

    def __call__(self, measure_candidates: list[MeasureCandidate],
                 builder_results: list[BuilderResult], runner_results: list[RunnerResult],
                 built_by: BuildIdentity | None = None) -> None:
        c = self.counters
        built_by = built_by or self.built_by
        if self.runner is not None and self.runner.started:  # the batch's time on the phones
            ended = self.runner.ended if self.runner.ended > self.runner.started else None
            c.measure_s += (ended or time.monotonic()) - self.runner.started
        outcomes = [outcome(built, ran) for built, ran in zip(builder_results, runner_results,
                                                              strict=True)]
        hot = self._note_phones(builder_results, [o[0] or "ok" for o in outcomes])
        for cand, built, (error_class, error_msg, run_secs) in zip(
                measure_candidates, builder_results, outcomes, strict=True):
            record = self.tuned.record(cand, run_secs)
            phone = self.runner.phone_log.phone_of.get(built.artifact_path or "", "") \
                if self.runner is not None else ""
            if error_class == "device_lost":
                lost = self._device_lost(candidate_hash(record), error_msg)
                if lost < CULPRIT_AFTER:
                    continue
                error_class = "culprit"
                error_msg = f"lost a phone {lost} times (crashed or froze it); last: {error_msg}"
            run_us = None if run_secs is None else sum(run_secs) / len(run_secs) * 1e6
            stored = StoredRecord(
                workload_key=self.workload_key, candidate=candidate_hash(record), record=record,
                run_us=run_us, error_class=error_class, error_msg=error_msg[-2000:],
                job_id=self.provenance.job_id, host=self.provenance.host,
                measured_at=time.time(),
                source=self.provenance.origins.get(candidate_hash(record), "job"),
                tvm=built_by.tvm if built_by is not None else TVM_VERSION,
                builder=built_by.stamp if built_by is not None else "", phone=phone,
            )
            if error_class is None and (built.artifact_path or "") in hot:
                stored = replace(stored, verified=False, source=f"hot:{phone}")
                c.hot += 1
            self._count(stored, phone)
        if self.on_progress is not None:
            try:
                self.on_progress(c)
            except Exception as e:  # the round's fence said stop: surface it after the loop
                c.store_error = e
                raise
