"""What a farm's Redis holds per measurement, key class by key class.

    python bench/store_memory.py FARM_HOME [FARM_HOME ...]

Loads each home's Redis (its AOF, copied: the home is not touched) into a scratch
redis-server on a free loopback port, asks `MEMORY USAGE` of every key, groups the keys by
their pattern (ids and hashes replaced by *) and prints bytes per class and per measurement
(a measurement: one candidate measured on a phone, as the jobs counted them; the records
of the store where no job counted). `used_memory` (every key plus Redis's own overhead) is
printed too: that is what maxmemory is compared with.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import redis

ID = re.compile(r"(?<=:)[^:]*?([0-9a-f]{12,}|\d{8}-\d{6}-[0-9a-f]+)[^:]*")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load(home: Path, scratch: Path) -> tuple[subprocess.Popen[bytes], redis.Redis]:
    src = home / "redis"
    shutil.copytree(src / "appendonlydir", scratch / "appendonlydir")
    conf = (src / "farm-redis.conf").read_text() if (src / "farm-redis.conf").exists() else ""
    password = re.search(r'requirepass "([^"]+)"', conf)
    port = free_port()
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(scratch),
            "--appendonly", "yes", "--save", ""]
    if password:
        args += ["--requirepass", password.group(1)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    client = redis.Redis(port=port, password=password.group(1) if password else None,
                         decode_responses=True)
    for _ in range(200):
        try:
            if client.ping() and client.info("persistence")["loading"] == 0:
                return proc, client
        except redis.RedisError:
            pass
        time.sleep(0.05)
    proc.terminate()
    raise SystemExit(f"{home}: its Redis did not load")


def measurements(r: redis.Redis) -> int:
    total = 0
    for key in r.scan_iter(match="tunefarm:job:*:counts", count=500):
        total += sum(int(v) for f, v in r.hgetall(key).items() if f.endswith("|measurements"))
    if total:
        return total
    return sum(r.hlen(k) for k in r.scan_iter(match="tunefarm:wl:*:records", count=500))


def report(home: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        proc, r = load(home, Path(tmp))
        try:
            by_class: dict[str, list[int]] = defaultdict(lambda: [0, 0])
            for key in r.scan_iter(count=1000):
                size = int(r.memory_usage(key, samples=0) or 0)
                cls = ID.sub("*", key)
                by_class[cls][0] += 1
                by_class[cls][1] += size
            n = measurements(r)
            used = int(r.info("memory")["used_memory"])
            empty = int(r.info("memory")["used_memory_startup"])
        finally:
            proc.terminate()
            proc.wait()
    keys_total = sum(b for _, b in by_class.values())
    print(f"{home}: {n} measurements; keys {keys_total} B ({keys_total / max(n, 1):.0f} B per "
          f"measurement); used_memory {used} B, {used - empty} B above an empty Redis "
          f"({(used - empty) / max(n, 1):.0f} B per measurement)")
    for cls, (count, size) in sorted(by_class.items(), key=lambda kv: -kv[1][1]):
        print(f"  {size:>10} B {size / max(n, 1):>8.1f} B/meas {count:>6} keys  {cls}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    for arg in sys.argv[1:]:
        report(Path(arg))
