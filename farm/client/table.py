"""`farm cache export --format csv`: the store's measurements as a table, for analysis in
pandas (`pd.read_csv`) as TenSet-style studies of a measurement set want them."""

from __future__ import annotations

from pathlib import Path

from farm.client.cache import check_out_dir, tasks_of
from farm.store import RecordStore

# the columns of `farm cache export --format csv`, one row per measurement
TABLE = ("workload_key", "task", "device_key", "family", "flop", "candidate", "run_us",
         "gflops", "valid", "error_class", "error", "job_id", "host", "source", "tvm", "builder",
         "measured_at", "verified")


def export_table(store: RecordStore, out_dir: Path, device_key: str | None = None) -> int:
    """`farm cache export --format csv`: every measurement of every workload (Redis's and the
    archive's, valid and failed) as one row of DIR/measurements.csv, for pandas and friends
    (`pd.read_csv`); returns the rows written."""
    import csv
    from datetime import datetime, timezone

    from farm.core.failures import brief
    from farm.store.cold import each_record

    check_out_dir(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tasks = {t.workload_key: t for t in tasks_of(store, device_key)}
    written = 0
    with open(out_dir / "measurements.csv", "w", newline="", encoding="utf-8") as fh:
        rows = csv.writer(fh)
        rows.writerow(TABLE)
        for rec in each_record(store, store.archive, list(tasks)):
            t = tasks[rec.workload_key]
            at = datetime.fromtimestamp(rec.measured_at, timezone.utc).isoformat() \
                if rec.measured_at else ""
            gflops = t.flop / rec.run_us / 1e3 if rec.valid and t.flop and rec.run_us else ""
            rows.writerow([rec.workload_key, t.name, t.device_key, t.family, t.flop,
                           rec.candidate, rec.run_us if rec.valid else "", gflops, rec.valid,
                           rec.error_class or "", brief(rec.error_msg) if rec.error_msg else "",
                           rec.job_id, rec.host, rec.source, rec.tvm, rec.builder, at,
                           rec.verified])
            written += 1
    return written
