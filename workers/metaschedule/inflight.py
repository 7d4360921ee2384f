"""The batches a round's search proposed and has not been told the results of yet.

A round's search runs one batch ahead of the phones (workers/round/loop.py): it proposes
batch k+1 while batch k is measured, so up to two of its batches wait for their results,
which are told in the order the batches were proposed. A candidate of batch k+1 that batch k
holds too (the random first batch and the evolutionary search do not know each other's
picks) is measured once: batch k+1 gets batch k's result for it, told after batch k's.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from tvm.s_tir.meta_schedule.runner import RunnerResult

from farm.core.aliases import MeasureCandidate
from farm.store import StoredRecord
from farm.store.store import Entry

UNMEASURED = RunnerResult(run_secs=None, error_msg="not measured: the round had its trials")


def stored_result(rec: StoredRecord | Entry) -> RunnerResult:
    if rec.valid:
        return RunnerResult(run_secs=[float(rec.run_us) * 1e-6], error_msg=None)  # type: ignore[arg-type]
    return RunnerResult(run_secs=None, error_msg=f"stored {rec.error_class}: not measured again")


@dataclass
class Proposed:
    """One batch the search proposed: its candidates and which of them go to the phones.

    - `known`: stored candidates (index -> the store's entry), told their stored result;
    - `twins`: a candidate the same batch holds earlier (index -> that index);
    - `ahead`: a candidate an earlier batch still in flight holds (index -> its hash);
    - `fresh`: the indices measured, `hashes` their candidates' hashes;
    - `lead`: candidates measured ahead of the search's (TVM's default schedule);
    - `own`: the batch is not the search's (imported records to verify, seeds): nothing told;
    - `first`: the batch came from the random first-batch sampler, not the evolutionary search.
    """

    cands: list[MeasureCandidate]
    known: dict[int, Entry] = field(default_factory=dict)
    twins: dict[int, int] = field(default_factory=dict)
    ahead: dict[int, str] = field(default_factory=dict)
    fresh: list[int] = field(default_factory=list)
    hashes: dict[int, str] = field(default_factory=dict)
    lead: int = 0
    own: bool = False
    first: bool = False


class InFlight:
    """The proposed batches, oldest first, and the results of this round's measured candidates
    by hash (for a later batch's copies of them)."""

    def __init__(self) -> None:
        self._queue: deque[Proposed] = deque()
        self._flying: set[str] = set()
        self._told: dict[str, RunnerResult] = {}

    def __len__(self) -> int:
        return len(self._queue)

    def flying(self, h: str) -> bool:
        """True when a batch in flight measures the candidate of hash `h`."""
        return h in self._flying

    def add(self, batch: Proposed) -> None:
        self._queue.append(batch)
        self._flying.update(batch.hashes[i] for i in batch.fresh if i in batch.hashes)

    def results(self, batch: Proposed, measured: list[RunnerResult]) -> list[RunnerResult]:
        """Every candidate's result for the search, from the batch's own measurements
        (`measured`: its fresh candidates', in order) and what the store or an earlier batch
        said; remembers the measured ones."""
        by_index = dict(zip(batch.fresh, measured, strict=True))
        for i, res in by_index.items():
            h = batch.hashes.get(i)
            if h is not None:
                self._flying.discard(h)
                self._told[h] = res
        out = []
        for i in range(len(batch.cands)):
            j = batch.twins.get(i, i)  # a twin gets the result of the one measured
            if j in batch.known:
                out.append(stored_result(batch.known[j]))
            elif j in batch.ahead:
                out.append(self._told.get(batch.ahead[j], UNMEASURED))
            else:
                out.append(by_index.get(j, UNMEASURED))
        return out

    def pop(self) -> Proposed:
        """The oldest batch, whose results come now."""
        if not self._queue:
            raise RuntimeError("notify_runner_results without a batch in flight")
        return self._queue.popleft()
