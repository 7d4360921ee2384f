"""`farm cache ls | show | stats | export | import | rm | verify | archive`: the record
store. Each action is a subcommand of its own (farm/client/cli.py: _cache_commands) and a
function here; `cmd_cache` opens the store for it."""

# Imports inside functions: the CLI loads a command's modules when it runs (`farm
# --help` and `farm status` start in ~0.15 s, not the ~0.3 s of loading every command's).

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from farm.client.common import config_of, say, store_of
from farm.core.aliases import JsonDict
from farm.core.errors import UsageError
from farm.store import RecordStore
from farm.store.store import ArchivedRecords, FarmView, ModelStore, RecordReader, RecordsAndJobs

if TYPE_CHECKING:
    from farm.core.config import FarmConfig


def cmd_cache(args: argparse.Namespace) -> int:
    if args.action == "verify":
        return _cache_verify(args)
    if args.action == "import":  # a wrong folder is refused before the store is opened
        from farm.client.cache import check_log_dir

        check_log_dir(Path(args.folder))
    with store_of(args) as store:
        ACTIONS[args.action](args, store)
    return 0


def verify(config: FarmConfig, tracker: str | None, workload_keys: list[str] | None,
           say: Callable[[str], None]) -> tuple[str, list[JsonDict]]:
    """`farm cache verify` and `farm.Cache.verify`: measure the stored bests of the config's
    device key (or of `workload_keys`) again on a phone of the key: the `tracker`'s (a lab
    farm's store needs one), else the embedded farm's emulated phones. (The device key, a
    row per best: stored and measured us, the drift, flagged past DRIFT_WARN.)"""
    from farm.pipeline.job import tuned_profile
    from farm.store import configured_store
    from workers.round.verify import verify_bests

    profile = tuned_profile(config, say)
    if config.store_url:
        if not tracker:
            raise UsageError("verifying a lab farm's store needs a tracker with phones of the "
                             "key", subject="farm cache verify",
                             hint="pass --tracker HOST:PORT of a worker host")
        from farm.local.embedded import farm_store

        with farm_store(config) as store:
            return profile.key, verify_bests(store, tracker, profile, config, workload_keys)
    from farm.local.embedded import embedded_farm

    with embedded_farm(config) as farm:
        store = configured_store(config, farm.broker_url)
        try:
            return profile.key, verify_bests(store, tracker or farm.tracker, profile, config,
                                             workload_keys)
        finally:
            store.close()


def _cache_verify(args: argparse.Namespace) -> int:
    """Measure the stored bests again on a phone of the key and print the drift."""
    from workers.round.verify import DRIFT_WARN

    config = config_of(args, broker_url=args.broker, device_key=args.device_key)
    wks = args.workload_keys.split(",") if args.workload_keys else None
    key, rows = verify(config, args.tracker, wks, say)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'workload key':26} {'stored us':>10} {'now us':>10} {'drift':>8}  task")
    for r in rows:
        now = f"{r['measured_us']:.1f}" if r["measured_us"] is not None else "-"
        drift = f"{r['drift']:+.0%}" if r["drift"] is not None else "-"
        flag = "  << drift" if r["flagged"] else (f"  error: {r['error']}" if r["error"] else "")
        print(f"{r['workload_key']:26} {r['stored_us']:10.1f} {now:>10} {drift:>8}  "
              f"{r['name']}{flag}")
    flagged = sum(1 for r in rows if r["flagged"])
    print(f"{len(rows)} bests measured again on {key}; {flagged} drifted more than "
          f"{DRIFT_WARN:.0%}")
    return 0


def archive(store: FarmView, retention_days: float) -> JsonDict:
    """`farm cache archive` and `farm.Cache.archive`: move the spool to the archive now and
    delete days past the retention (0: keep every day); what the archive holds after."""
    from farm.store.cold import drain
    from farm.store.retention import prune

    if store.archive is None:
        raise UsageError("this store has no archive", hint="set FARM_ARCHIVE")
    moved = drain(store, store.archive)
    gone = prune(store, store.archive, retention_days)
    files = store.archive.files()
    return {"archive": store.archive.url, "files": len(files),
            "bytes": sum(store.archive.fs.size(f) for f in files), "moved": moved,
            "waiting": store.spool_size(), "days_deleted": len(gone),
            "retention_days": retention_days}


def _archive(args: argparse.Namespace, store: FarmView) -> None:
    """`farm cache archive`: move the spool to the archive now, delete days past the
    retention, and say where the archive is and what it holds."""
    retention = config_of(args, broker_url=getattr(args, "broker", None)).archive_retention_days
    a = archive(store, retention)
    print(f"archive {a['archive']}: {a['files']} files, {a['bytes']} bytes; {a['moved']} "
          f"records moved from Redis now, {a['waiting']} waiting; {a['days_deleted']} days "
          f"deleted (retention: {f'{retention:g} days' if retention > 0 else 'always'})")


def _import(args: argparse.Namespace, store: RecordsAndJobs) -> None:
    """`farm cache import`: seed the store from a JSONDatabase folder, as unverified records."""
    from dataclasses import replace

    from farm.client import cache
    from farm.pipeline.job import tuned_profile

    config = config_of(args, broker_url=getattr(args, "broker", None))
    key = args.device_key or config.device_key
    profile = tuned_profile(replace(config, device_key=key), say)
    got = cache.import_log(store, Path(args.folder), profile, retarget=args.retarget)
    print(f"imported {got.new} new records of {got.workloads} workloads for device key "
          f"{key} ({got.known} already stored); unverified until a phone of the farm "
          f"measures them (the next job's first rounds measure the best of them)")
    for line in got.lines():
        print(line)
    if got.refused and not got.new and not got.known:
        raise UsageError(f"every record was refused ({sum(got.refused.values())})",
                         subject=args.folder, hint="see the reasons above")


def _ls(args: argparse.Namespace, store: RecordReader) -> None:
    from farm.client import cache

    rows = cache.entries(store, args.device_key)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'workload key':26} {'device key':14} {'trials':>6} {'unverified':>10} "
          f"{'best us':>10}  task")
    for r in rows:
        best = f"{r['best_us']:.1f}" if r["best_us"] is not None else "-"
        print(f"{r['workload_key']:26} {r['device_key']:14} {r['trials']:6} "
              f"{r['unverified']:10} {best:>10}  {r['name']}")


def _show(args: argparse.Namespace, store: ArchivedRecords) -> None:
    from farm.client import cache

    print(json.dumps(cache.show(store, args.workload_key, args.top), indent=2))


def _stats(args: argparse.Namespace, store: FarmView) -> None:
    from farm.client import cache

    print(json.dumps(cache.stats(store), indent=2))


def _export(args: argparse.Namespace, store: ModelStore) -> None:
    from farm.client import cache

    if args.format in ("csv", "parquet") or args.features:  # --features: parquet's only
        from farm.client.table import FORMATS, export_table

        n = export_table(store, Path(args.folder), args.device_key, args.format, args.features)
        print(f"exported {n} measurements (every one, the archive's too) to "
              f"{args.folder}/{FORMATS[args.format]}")
    elif args.all:
        n = cache.export_all(store, Path(args.folder), args.device_key)
        print(f"exported {n} records (every one, the archive's too) to {args.folder}/ "
              "(MetaSchedule JSONDatabase)")
    else:
        n = cache.export(store, Path(args.folder), args.device_key)
        print(f"exported the best record of {n} workloads to {args.folder}/ (MetaSchedule "
              "JSONDatabase)")


def _rm(args: argparse.Namespace, store: RecordsAndJobs) -> None:
    from farm.client import cache

    wks = args.workload_keys.split(",") if args.workload_keys else []
    gone = cache.remove(store, wks, args.source)
    print(f"removed {gone['workloads']} workloads and {gone['records']} records"
          + (f" from {args.source}" if args.source else ""))


# each action of `farm cache` that reads or writes the store (verify starts phones: above)
ACTIONS: dict[str, Callable[[argparse.Namespace, RecordStore], None]] = {
    "ls": _ls, "show": _show, "stats": _stats, "export": _export, "import": _import,
    "rm": _rm, "archive": _archive}
