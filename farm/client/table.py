"""`farm cache export --format csv|parquet`: the store's measurements as a table, one row per
measurement, for analysis in pandas (`pd.read_csv`, `pd.read_parquet`) as TenSet-style
studies of a measurement set want them. Parquet needs pyarrow (`pip install
'tunefarm[export]'`); its columns are typed (a failure's run time is null, the time a UTC
timestamp) and it is written in row groups, so a store of millions of measurements is
never held in memory whole. `--features` adds each measurement's cost-model features (the
matrix MetaSchedule's per-store feature extractor makes of its schedule: a row per block) as
a list of rows, where the store has them cached (the records the key's model trained on; a
lab's are on its worker hosts' disks: null here)."""

# Imports inside functions: `farm cache export` loads the archive and the failure
# classes when it runs.

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from itertools import islice
from pathlib import Path
from typing import Any

from farm.client.cache import check_out_dir, tasks_of
from farm.core.errors import UsageError
from farm.store.packing import feature_matrix
from farm.store.store import ModelStore

# the columns of `farm cache export --format csv|parquet`, one row per measurement
TABLE = ("workload_key", "task", "device_key", "family", "flop", "candidate", "run_us",
         "gflops", "valid", "error_class", "error", "job_id", "host", "phone", "source", "tvm",
         "builder", "measured_at", "verified")
FORMATS = {"csv": "measurements.csv", "parquet": "measurements.parquet"}
ROW_GROUP = 50_000  # rows of a parquet row group (a few MB of memory)


def _rows(store: ModelStore, device_key: str | None,
          features: bool = False) -> Iterator[tuple[Any, ...]]:
    """Every measurement of every workload (Redis's and the archive's, valid and failed) as a
    row of TABLE's columns (and, with `features`, its feature matrix as a list of rows, None
    where not cached); a failure's run time and GFLOPS are None, the time a UTC datetime
    (None when unknown)."""
    from farm.core.failures import brief
    from farm.store.cold import each_record

    tasks = {t.workload_key: t for t in tasks_of(store, device_key)}
    cached: dict[str, str] = {}
    wk_cached = ""
    for rec in each_record(store, store.archive, list(tasks)):
        if features and rec.workload_key != wk_cached:  # a workload's records come together
            cached, wk_cached = store.features(rec.workload_key), rec.workload_key
        t = tasks[rec.workload_key]
        at = datetime.fromtimestamp(rec.measured_at, timezone.utc) if rec.measured_at else None
        gflops = t.flop / rec.run_us / 1e3 if rec.valid and t.flop and rec.run_us else None
        row: tuple[Any, ...] = (
            rec.workload_key, t.name, t.device_key, t.family, t.flop, rec.candidate,
            rec.run_us if rec.valid else None, gflops, rec.valid, rec.error_class,
            brief(rec.error_msg) if rec.error_msg else "", rec.job_id, rec.host, rec.phone,
            rec.source, rec.tvm, rec.builder, at, rec.verified)
        matrix = feature_matrix(cached.get(rec.candidate, "")) if features else None
        yield (*row, None if matrix is None else matrix.tolist()) if features else row


def export_table(store: ModelStore, out_dir: Path, device_key: str | None = None,
                 fmt: str = "csv", features: bool = False) -> int:
    """`farm cache export --format csv|parquet [--features]`: every measurement as one row of
    DIR/measurements.csv or DIR/measurements.parquet; returns the rows written."""
    if features and fmt != "parquet":
        raise UsageError("--features needs --format parquet (a matrix a row is no CSV cell)",
                         subject="--features", hint="add --format parquet")
    if fmt not in FORMATS:
        raise UsageError(f"no table format {fmt!r}", hint=f"one of {', '.join(FORMATS)}")
    writer = _parquet_writer(features) if fmt == "parquet" else None  # no pyarrow: no file
    check_out_dir(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if writer is not None:
        return writer(_rows(store, device_key, features), out_dir / FORMATS[fmt])
    return _write_csv(_rows(store, device_key), out_dir / FORMATS[fmt])


def _write_csv(rows: Iterator[tuple[Any, ...]], path: Path) -> int:
    import csv

    written = 0
    with open(path, "w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(TABLE)
        for row in rows:  # None as an empty cell, the time in ISO 8601
            out.writerow(["" if v is None else v.isoformat() if isinstance(v, datetime) else v
                          for v in row])
            written += 1
    return written


def _parquet_writer(features: bool = False) -> Any:
    """The parquet writer (rows, path) -> rows written; UsageError without pyarrow."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:
        raise UsageError("--format parquet needs pyarrow, which is not installed",
                         hint="pip install 'tunefarm[export]' (or pyarrow), or use "
                              "--format csv") from e
    text, num = pa.string(), pa.float64()
    types = {"flop": num, "run_us": num, "gflops": num, "valid": pa.bool_(),
             "measured_at": pa.timestamp("ms", tz="UTC"), "verified": pa.bool_()}
    schema = pa.schema([(name, types.get(name, text)) for name in TABLE]
                       + ([("features", pa.list_(pa.list_(pa.float32())))] if features else []))

    def write(rows: Iterator[tuple[Any, ...]], path: Path) -> int:
        written = 0
        with pq.ParquetWriter(str(path), schema, compression="zstd") as out:
            while True:
                group = list(islice(rows, ROW_GROUP))
                if not group:
                    break
                columns = list(zip(*group, strict=True))
                out.write_table(pa.Table.from_arrays(
                    [pa.array(col, type=schema.field(i).type) for i, col in enumerate(columns)],
                    schema=schema))
                written += len(group)
                if len(group) < ROW_GROUP:
                    break
        return written

    return write
