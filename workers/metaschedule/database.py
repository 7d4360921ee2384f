"""A MetaSchedule `Database` over the record store, for one workload's round.

`get_top_k` reads the records already in the store, so every round starts its
search from the best candidates measured so far (by any host, any job).
Records are committed by `StoreCallback` (workers/metaschedule/callback.py) the moment they
are measured, with their failure class, so this database does not write them.
"""

from __future__ import annotations

import logging

from tvm.ir import IRModule
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.database import PyDatabase, TuningRecord, Workload

from farm.store import StoredRecord
from farm.store.store import RecordReader
from farm.tir.module import tuning_record as tir_tuning_record

log = logging.getLogger(__name__)


def tuning_record(rec: StoredRecord, workload: Workload) -> TuningRecord:
    """A stored record as MetaSchedule's TuningRecord, to be replayed and built. ValueError
    when its trace holds what MetaSchedule's search never writes (farm/core/traces.py): the
    store can be written by others, so it is checked here, before any build."""
    return tir_tuning_record(rec.record, workload)


def replays(trace: object) -> None:
    """ValueError where MetaSchedule's evolutionary search could not replay and mutate
    `trace`: a sampled schedule (it has sampling decisions) whose postprocessors' part is
    not marked (no EnterPostproc). The search replays the store's top records with that part
    dropped and mutates their decisions; an unmarked one replays the postprocessors' loop
    splits as schedule instructions on the mutated loops, and TVM fails the whole round in
    its threads ("old_outputs.size() == new_outputs.size()"). MetaSchedule's own search
    always marks it; the farm's first transferred seeds did not. Skipped, such a record
    costs only its place among the search's starting points."""
    kinds = {inst.kind.name for inst in trace.insts}  # type: ignore[attr-defined]
    if "EnterPostproc" not in kinds and any(k.startswith("Sample") for k in kinds):
        raise ValueError("its postprocessing is not marked (no EnterPostproc): TVM's "
                         "evolutionary search cannot mutate it")


@derived_object
class StoreDatabase(PyDatabase):
    def __init__(self, store: RecordReader, workload_key: str, mod: IRModule) -> None:
        super().__init__()
        self.store = store
        self.workload_key = workload_key
        self.workload = Workload(mod)

    def has_workload(self, mod: IRModule) -> bool:
        import tvm

        return bool(tvm.ir.structural_equal(mod, self.workload.mod))

    def commit_workload(self, mod: IRModule) -> Workload:
        return self.workload

    def commit_tuning_record(self, record: TuningRecord) -> None:
        """Nothing to do: every record reaches the store through StoreCallback, classified."""

    def get_top_k(self, workload: Workload, top_k: int) -> list[TuningRecord]:
        if top_k <= 0:
            return []
        valid = [r for r in self.store.records(self.workload_key) if r.valid]
        valid.sort(key=lambda r: r.run_us)  # type: ignore[arg-type,return-value]
        out = []
        for rec in valid[:top_k]:
            try:
                found = tuning_record(rec, self.workload)
                replays(found.trace)
            except Exception as e:  # noqa: BLE001 - bad data is skipped, never fatal
                log.warning("workload %s: record %s unreadable, skipped: %s",
                            self.workload_key, rec.candidate, e)
                continue
            out.append(found)
        return out

    def get_all_tuning_records(self) -> list[TuningRecord]:
        out = []
        for rec in self.store.records(self.workload_key):
            try:
                out.append(tuning_record(rec, self.workload))
            except Exception as e:  # noqa: BLE001
                log.warning("workload %s: record %s unreadable, skipped: %s",
                            self.workload_key, rec.candidate, e)
        return out

    def __len__(self) -> int:
        return self.store.record_count(self.workload_key)
