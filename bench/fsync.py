"""What `appendfsync always` costs the record store: commits per second against a Redis with
`everysec` and one with `always`, side by side in one run (interleaved batches, same disk).

A round commits one record per measured candidate (a few per second on phones); this
measures how far that is from the store's limit.

    python bench/fsync.py [--records 2000] [--out bench/fsync.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from farm.local import services  # noqa: E402
from farm.store import StoredRecord, open_store  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--out", default=str(ROOT / "bench" / "fsync.md"))
    args = ap.parse_args()
    group = services.ServiceGroup()
    elapsed = {"everysec": 0.0, "always": 0.0}
    with tempfile.TemporaryDirectory(prefix="farm-fsync-") as tmp:
        try:
            stores = {}
            for mode in elapsed:
                svc, url = services.start_redis(Path(tmp) / mode, Path(tmp) / "logs")
                group.add(svc)
                store = open_store(url)
                store.r.config_set("appendfsync", mode)  # type: ignore[attr-defined]
                stores[mode] = store
            payload = [{"trace": "x" * 1500}, [1e-4], {"kind": "llvm"}, []]  # a record's size
            for start in range(0, args.records, args.batch):
                for mode, store in stores.items():
                    t0 = time.perf_counter()
                    for i in range(start, min(args.records, start + args.batch)):
                        store.add_record(StoredRecord(
                            workload_key="wk", candidate=f"c{i}", record=payload,
                            run_us=100.0 + i, job_id="bench"))
                    elapsed[mode] += time.perf_counter() - t0
        finally:
            group.stop()
    rate = {m: args.records / s for m, s in elapsed.items()}
    text = (f"# Record commits: appendfsync everysec vs always ({time.strftime('%Y-%m-%d %H:%M')},"
            f" {os.cpu_count()} cores, bench/fsync.py, {args.records} records each, interleaved "
            f"batches of {args.batch})\n\n| appendfsync | records/s | ms per record |\n|---|---|---|\n"
            + "".join(f"| {m} | {rate[m]:.0f} | {1000 / rate[m]:.3f} |\n" for m in elapsed)
            + f"\nratio always/everysec (records/s): {rate['always'] / rate['everysec']:.3f}\n")
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
