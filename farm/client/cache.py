"""The record store as a cache users can see and move: ls, show, stats, export, import.

Export writes a MetaSchedule JSONDatabase (the best record per workload); import
seeds the store from any JSONDatabase, e.g. a log tuned by another TVM user, for
one device key (whose profile gives the target the workload key is built from).
"""

# Imports inside functions: `farm cache`'s subcommands load what they run (the archive
# and the capacity model only where asked).

from __future__ import annotations

import json
import logging
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from farm.core.aliases import IRModule, JsonDict, JsonList, JsonValue, Target
from farm.core.errors import StoreError, UsageError, last_line
from farm.core.failures import brief
from farm.core.messages import TuneTask
from farm.core.profiles import DeviceProfile
from farm.core.traces import UnsafeTrace, foreign_calls, trace_problem
from farm.jobs.finalize import write_best_log
from farm.pipeline.extract import workload_key
from farm.store import StoredRecord, candidate_hash
from farm.store.cold import all_records
from farm.store.store import (
    FAILED_RUN_SECS,
    ArchivedRecords,
    FarmView,
    RecordReader,
    RecordsAndJobs,
    valid_secs,
)
from farm.tir.blocknames import canonical_module, translation
from farm.tir.module import load_mod, record_json, tuning_record

if TYPE_CHECKING:
    from tvm.s_tir.meta_schedule.database import Workload

log = logging.getLogger(__name__)

Rename = Callable[[JsonList], JsonList]  # a record as tuned, renamed to the stored module's blocks


def entries(store: RecordReader, device_key: str | None = None) -> list[JsonDict]:
    out = []
    for wk in store.workload_keys():
        task = store.get_workload(wk)
        if task is None or (device_key and task.device_key != device_key):
            continue
        best = store.best(wk)
        out.append({"workload_key": wk, "name": task.name, "device_key": task.device_key,
                    "trials": store.record_count(wk), "unverified": store.unverified_count(wk),
                    "best_us": round(best.run_us, 3) if best and best.run_us else None,
                    "best_job": best.job_id if best else None})
    return out


def show(store: ArchivedRecords, wk: str, top: int = 5) -> JsonDict:
    task = store.get_workload(wk)
    if task is None:
        raise StoreError("no such workload in the store", subject=f"workload {wk}",
                         hint="`farm cache ls` lists them")
    records = all_records(store, store.archive, wk)
    valid = sorted((r for r in records if r.valid), key=lambda r: r.run_us)  # type: ignore[arg-type,return-value]
    failures = Counter(r.error_class for r in records if not r.valid)
    errors: dict[str, str] = {}  # class -> the first message measured (the phone's own words)
    for r in sorted((r for r in records if not r.valid), key=lambda r: r.measured_at):
        errors.setdefault(r.error_class or "failed", brief(r.error_msg))
    return {
        "workload_key": wk, "name": task.name, "device_key": task.device_key,
        "target": task.target, "weight": task.weight, "trials": len(records),
        "valid": len(valid), "failures": dict(failures), "errors": errors,
        "unverified": sum(1 for r in records if not r.verified),
        "jobs": sorted({r.job_id for r in records if r.job_id}),
        "hosts": sorted({r.host for r in records if r.host}),
        "sources": dict(Counter(r.source for r in records)),
        "top": [{"candidate": r.candidate, "run_us": round(r.run_us or 0.0, 3), "job_id": r.job_id,
                 "host": r.host, "phone": r.phone, "source": r.source, "tvm": r.tvm,
                 "builder": r.builder, "verified": r.verified}
                for r in valid[:top]],  # type: ignore[arg-type]
    }


def stats(store: FarmView) -> JsonDict:
    by_key: Counter = Counter()
    trials = 0
    valid = 0
    failures: Counter = Counter()
    times: list[float] = []  # every record's, for the capacity
    hot = 0
    for wk in store.workload_keys():
        task = store.get_workload(wk)
        by_key[task.device_key if task else "?"] += 1
        hot += len(store.records(wk))
        for r in store.entries(wk):
            trials += 1
            times.append(r.measured_at)
            if r.valid:
                valid += 1
            else:
                failures[r.error_class or "failed"] += 1
    from farm.store.capacity import capacity

    return {"workloads": sum(by_key.values()), "trials": trials, "valid": valid,
            "failures": dict(failures), "workloads_by_device_key": dict(by_key),
            "jobs": len(store.job_ids()), "whole_in_redis": hot,
            "spooled": store.spool_size(), "dead_letters": store.dead_letters(),
            "archive": store.archive.url if store.archive else None,
            "capacity": capacity(store, times=times).to_json()}


def check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError("is a file: the log is a folder (two JSON files)", subject=str(out_dir),
                         hint="name a folder that does not exist yet, or an empty one")


def tasks_of(store: RecordReader, device_key: str | None) -> list[TuneTask]:
    """The store's workloads (of `device_key`, when given)."""
    return [t for t in (store.get_workload(wk) for wk in store.workload_keys())
            if t is not None and (device_key is None or t.device_key == device_key)]


def export(store: RecordReader, out_dir: Path, device_key: str | None = None) -> int:
    check_out_dir(out_dir)
    tasks = tasks_of(store, device_key)
    picks = {t.workload_key: b.candidate for t in tasks
             if (b := store.best(t.workload_key)) is not None and b.valid}
    bests = write_best_log(store, tasks, out_dir, picks)
    return sum(1 for b in bests.values() if b is not None)


def export_all(store: ArchivedRecords, out_dir: Path, device_key: str | None = None) -> int:
    """`farm cache export --all`: every record of every workload (Redis's and the archive's,
    valid and failed) as a MetaSchedule JSONDatabase; returns the records written."""
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    from farm.store.cold import each_record

    check_out_dir(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    db = JSONDatabase(work_dir=str(out_dir), module_equality="structural")
    written = 0
    workloads = {t.workload_key: db.commit_workload(load_mod(t))
                 for t in tasks_of(store, device_key)}
    # streamed: Redis's records, then one pass over the archive for them all (it drains the
    # spool first); only the records' entries are held, not the records
    for rec in each_record(store, store.archive, list(workloads)):
        try:
            db.commit_tuning_record(tuning_record(rec.record, workloads[rec.workload_key]))
        except Exception as e:  # noqa: BLE001 - an unreadable record is skipped, said
            log.warning("export: record %s of %s skipped: %s", rec.candidate,
                        rec.workload_key, e)
            continue
        written += 1
    return written


@dataclass
class ImportTally:
    """What `farm cache import` took and what it refused (reason -> count, and examples)."""

    workloads: int = 0
    new: int = 0
    known: int = 0  # candidates the store holds already
    refused: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)

    def refuse(self, reason: str, where: str) -> None:
        self.refused[reason] += 1
        self.examples.setdefault(reason, where)

    def lines(self) -> list[str]:
        out = [f"{n} refused: {why} (first: {self.examples[why]})"
               for why, n in self.refused.most_common()]
        return out


def _read_lines(path: Path, tally: ImportTally) -> list[tuple[int, JsonValue]]:
    out = []
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read it: {e}", subject=str(path)) from e
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((n, json.loads(line)))
        except ValueError as e:
            tally.refuse("not JSON", f"{path.name}:{n}: {e}")
        except RecursionError:  # a crafted line nested thousands deep
            tally.refuse("nested too deeply to be a record", f"{path.name}:{n}")
    return out


def check_log_dir(log_dir: Path) -> None:
    """Refuse a folder that is not a MetaSchedule JSONDatabase (before any store is opened)."""
    for name in ("database_workload.json", "database_tuning_record.json"):
        if not (log_dir / name).is_file():
            raise UsageError(f"not a MetaSchedule JSONDatabase: {name} is missing",
                             subject=str(log_dir), hint="pass the folder of a JSONDatabase "
                             "(a tuning work_dir or `farm cache export`)")


def _read_workloads(log_dir: Path, profile: DeviceProfile,
                    tally: ImportTally) -> dict[int, tuple[Workload, str] | None]:
    """database_workload.json: line index -> (workload, its key here), None when unreadable."""
    import tvm
    import tvm_ffi
    from tvm.s_tir.meta_schedule.database import Workload

    workloads: dict[int, tuple[Workload, str] | None] = {}
    for index, (n, row) in enumerate(_read_lines(log_dir / "database_workload.json", tally)):
        try:
            wl = Workload.from_json(row)
            workloads[index] = (wl, workload_key(tvm_ffi.structural_hash(wl.mod),
                                                 profile.target_json(), profile.key))
        except Exception as e:  # noqa: BLE001 - one bad workload refuses its records only
            workloads[index] = None
            tally.refuse("workload unreadable", f"database_workload.json:{n}: {last_line(e)}")
            continue
        calls = foreign_calls(tvm.ir.save_json(wl.mod))
        if calls:  # its kernels would call whatever it names, on the builder and the phones
            workloads[index] = None
            tally.refuse(f"its TIR calls outside TVM's operators ({', '.join(calls)})",
                         f"database_workload.json:{n}")
    return workloads


def _file_workload(store: RecordsAndJobs, wl: Workload, wk: str, profile: DeviceProfile,
                   source: str) -> IRModule:
    """An imported workload, filed under its key for the profile (named after its function,
    its blocks by place unless the store had the workload already); the module filed."""
    import tvm

    store.put_workload(TuneTask(
        name=f"imported:{_func_name(wl.mod)}", workload_key=wk, weight=1,
        mod_json=tvm.ir.save_json(canonical_module(wl.mod)), target=profile.target_json(),
        device_key=profile.key), source)
    filed = store.get_workload(wk)  # this one, or the one the store had: its block names count
    return load_mod(filed) if filed is not None else wl.mod


def _imported(data: JsonList, wk: str, secs: list[float], failed: bool, host: str,
              source: str) -> StoredRecord:
    """An imported record: unverified (never a job's choice before a phone measured it)."""
    return StoredRecord(
        workload_key=wk, candidate=candidate_hash(data), record=data,
        run_us=None if failed else sum(secs) / len(secs) * 1e6,
        error_class="runtime" if failed else None, job_id="", host=host,
        measured_at=time.time(), source=source, tvm="", verified=False)


def import_log(store: RecordsAndJobs, log_dir: Path, profile: DeviceProfile,
               retarget: bool = False) -> ImportTally:
    """Seed the store from a JSONDatabase folder, record by record, as unverified records.

    Each record is checked: its workload reads back, its trace applies to the workload, its
    run times are finite and > 0 (or MetaSchedule's failure mark), its target is the
    profile's (unless `retarget`: then it is filed under the profile's target). A record that
    fails a check is refused and counted in the tally. Imported records warm the search and
    the cost model; none is a job's final choice before a phone of the farm measured it."""
    import tvm
    from tvm.s_tir.meta_schedule.database import TuningRecord

    check_log_dir(log_dir)
    tally = ImportTally()
    source = f"import:{log_dir.resolve()}"
    host = socket.gethostname()
    want = tvm.target.Target(profile.target_json())
    workloads = _read_workloads(log_dir, profile, tally)
    filed: dict[str, IRModule] = {}  # workload key -> the store's module of it
    renames: dict[int, Rename] = {}  # workload line -> its records' translation to that module
    for n, row in _read_lines(log_dir / "database_tuning_record.json", tally):
        where = f"database_tuning_record.json:{n}"
        found, why = _row_problem(row, workloads)
        if found is None:
            tally.refuse(why, where)
            continue
        wl, wk = found
        try:
            rec = tuning_record(row[1], wl)  # the trace applies, and makes no foreign call
            rec.as_measure_candidate()
        except UnsafeTrace as e:
            tally.refuse("its schedule calls outside TVM's operators", f"{where}: {e}")
            continue
        except Exception as e:  # noqa: BLE001
            tally.refuse("its trace does not apply to its workload", f"{where}: {last_line(e)}")
            continue
        secs = [float(x) for x in (rec.run_secs or [])]
        failed = bool(secs) and all(x >= FAILED_RUN_SECS for x in secs)
        if not failed and not (secs and all(valid_secs(x) for x in secs)):
            tally.refuse("run times not finite and > 0", f"{where}: {secs[:4]}")
            continue
        if rec.target is None or _canonical(rec.target) != _canonical(want):
            if not retarget:
                tally.refuse(f"target is not the profile's ({profile.key}: {want}); "
                             "--retarget files it under the profile", f"{where}: {rec.target}")
                continue
            rec = TuningRecord(rec.trace, wl, rec.run_secs, want, rec.args_info)
        try:  # to the stored module's block names (the workload filed with its first record)
            data = record_json(rec)
            data = _to_stored(store, filed, renames, row[0], found, profile, source)(data)
        except (ValueError, TypeError) as e:
            tally.refuse("its blocks differ from the stored workload's", f"{where}: {e}")
            continue
        if store.add_record(_imported(data, wk, secs, failed, host, source)):
            tally.new += 1
        else:
            tally.known += 1
    tally.workloads = len(filed)
    return tally


def _row_problem(row: JsonValue, workloads: dict[int, tuple[Workload, str] | None]
                 ) -> tuple[tuple[Workload, str] | None, str]:
    """(the row's workload and its key, "") or (None, why the row is refused): a pair of a
    workload index that was read and a record whose trace is MetaSchedule's own."""
    if not (isinstance(row, list) and len(row) == 2 and isinstance(row[0], int)):
        return None, "not a [workload index, record] pair"
    found = workloads.get(row[0])
    if found is None:
        return None, "its workload is missing or unreadable"
    problem = trace_problem(row[1])
    if problem is not None:
        return None, f"its trace is not MetaSchedule's: {problem}"
    return found, ""


def _to_stored(store: RecordsAndJobs, filed: dict[str, IRModule], renames: dict[int, Rename],
               index: int, found: tuple[Workload, str], profile: DeviceProfile,
               source: str) -> Rename:
    """How the records of workload line `index` are renamed to the blocks of the store's module
    of their key (the workload filed first when the store lacks it); ValueError if they cannot."""
    wl, wk = found
    if wk not in filed:
        filed[wk] = _file_workload(store, wl, wk, profile, source)
    if index not in renames:
        renames[index] = translation(wl.mod, filed[wk])
    return renames[index]


def _canonical(target: Target) -> str:
    """A target as comparable text (attribute order and tuple/list do not matter)."""
    try:
        return json.dumps(json.loads(str(target)), sort_keys=True)  # a target prints as JSON
    except ValueError:
        return str(target)


def remove(store: RecordsAndJobs, workload_keys: list[str], source: str | None = None) -> dict[str, int]:
    """`farm cache rm`: forget whole workloads, or (with `source`) only the records that came
    from it: a whole job id, host or source, or an import (`import:<path>`, or a folder
    above it: `import:/data/logs`). Returns {"workloads": n, "records": n} removed. Neither
    keys nor a source, or a key the store does not hold: a UsageError, nothing removed."""
    if not workload_keys and not source:
        raise UsageError("farm cache rm needs workload keys or --source",
                         hint="`farm cache ls` lists workload keys; --source takes a job "
                              "id, a host or an import path")
    unknown = [wk for wk in workload_keys if store.get_workload(wk) is None]
    if unknown:
        raise UsageError(f"no such workload: {', '.join(unknown)}", subject="farm cache rm",
                         hint="`farm cache ls` lists them")
    if source is None:
        gone = sum(1 for wk in workload_keys if store.remove_workload(wk))
        return {"workloads": gone, "records": 0}
    removed = 0
    folder = source.rstrip("/") + "/" if source.startswith("import:/") else None
    for wk in workload_keys or store.workload_keys():
        picked = [r.candidate for r in all_records(store, store.archive, wk)
                  if source in (r.job_id, r.host, r.source)
                  or (folder is not None and r.source.startswith(folder))]
        removed += store.remove_records(wk, picked)
    return {"workloads": 0, "records": removed}


def _func_name(mod: IRModule) -> str:
    names = [gv.name_hint for gv in mod.get_global_vars()]
    return names[0] if names else "main"
