"""`farm cache verify`: measure the stored best of each workload again on a phone, and
report how far today's time is from the stored one (drift: a phone that got slower or
faster, another app on it, a thermal state, or a record that was never right).

It builds and runs like a round (the worker's warm builder and bounded runner, with the
profile's export and timing settings), one batch for every workload asked for.
"""

from __future__ import annotations

import logging
import socket

from farm.core.aliases import JsonDict, MeasureCandidate
from farm.core.config import FarmConfig
from farm.core.errors import ServiceError, UsageError
from farm.core.messages import TuneTask
from farm.core.profiles import DeviceProfile
from farm.devices import tracker as tracker_mod
from farm.store import StoredRecord
from farm.store.store import RecordReader
from farm.tir.module import load_mod
from workers.metaschedule.database import tuning_record
from workers.metaschedule.runner import classify_run_error
from workers.round.context import WorkerContext

log = logging.getLogger(__name__)
DRIFT_WARN = 0.2  # a best that measures 20 % away from its stored time is flagged


def verify_bests(store: RecordReader, tracker: str, profile: DeviceProfile, config: FarmConfig,
                 workload_keys: list[str] | None = None) -> list[JsonDict]:
    """One row per workload of the profile's key with a best record: stored us, measured us,
    drift (measured / stored - 1), or the error that kept it from running."""
    import tvm
    from tvm.s_tir.meta_schedule.builder import BuilderInput
    from tvm.s_tir.meta_schedule.database import Workload
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    phones = tracker_mod.phones(tracker).get(profile.key)
    if phones is None or phones.total == 0:
        raise ServiceError(f"no phone of key {profile.key} on this tracker",
                           subject=f"tracker {tracker}",
                           hint="start the phones' RPC apps (or `farm phones`) with this key")
    rows: dict[str, JsonDict] = {}  # workload key -> its row
    runnable: list[tuple[str, MeasureCandidate]] = []
    for wk in workload_keys or store.workload_keys():
        task = store.get_workload(wk)
        if task is None:
            raise UsageError("no such workload in the store", subject=f"workload {wk}",
                             hint="`farm cache ls` lists them")
        best = store.best(wk)
        if task.device_key != profile.key or best is None:
            continue
        workload = Workload(load_mod(task))
        try:
            cand = tuning_record(best, workload).as_measure_candidate()
        except Exception as e:  # noqa: BLE001 - reported in its row
            rows[wk] = _row(wk, task, best, f"unreadable: {e}")
            continue
        rows[wk] = _row(wk, task, best, "")
        runnable.append((wk, cand))
    ctx = WorkerContext(config=config, tracker=tracker, host=socket.gethostname())
    if runnable:
        target = tvm.target.Target(profile.target_json())
        built = ctx.builder(profile).build([BuilderInput(cand.sch.mod, target)
                                            for _, cand in runnable])
        to_run = [(p, b) for p, b in zip(runnable, built, strict=True)]
        for (wk, _), b in to_run:
            if b.error_msg:
                rows[wk]["error"] = f"build: {b.error_msg.strip().splitlines()[-1][:200]}"
        ok = [(p, b) for p, b in to_run if not b.error_msg]
        runner = ctx.runner(profile, phones.total)
        runner.set_reference(None)
        # the device the phone runs it on: "cpu" for an LLVM target, else the kind (opencl...)
        device = "cpu" if target.kind.name == "llvm" else target.kind.name
        futures = runner.run([RunnerInput(b.artifact_path, device, cand.args_info)
                              for (_, cand), b in ok])
        for ((wk, _), _), fut in zip(ok, futures, strict=True):
            res = fut.result()
            row = rows[wk]
            if res.error_msg:
                row["error"] = (f"{classify_run_error(res.error_msg)}: "
                                f"{res.error_msg.strip().splitlines()[-1][:200]}")
                continue
            secs = [float(s) for s in res.run_secs]
            row["measured_us"] = round(sum(secs) / len(secs) * 1e6, 3)
            row["drift"] = round(row["measured_us"] / row["stored_us"] - 1, 4)
            row["flagged"] = abs(row["drift"]) > DRIFT_WARN
    return list(rows.values())


def _row(wk: str, task: TuneTask, best: StoredRecord, error: str) -> JsonDict:
    stored_us = round(best.run_us, 3) if best.run_us is not None else None  # a best is valid
    return {"workload_key": wk, "name": task.name, "candidate": best.candidate,
            "stored_us": stored_us, "stored_by": best.job_id or best.source,
            "host": best.host, "measured_us": None, "drift": None, "flagged": False,
            "error": error}
