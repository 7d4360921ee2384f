"""The archive: every whole record that left Redis, append-only, compressed.

Redis keeps an entry for every measured candidate (deduplication, the best, accounting) and
the whole record of each workload's K fastest (farm/store/packing.py). A whole record that
leaves the K, and every failure past them, is pushed onto the store's spool by the commit
itself (keep_best.lua, atomic with it); `drain` moves the spool into the archive: JSON lines
compressed with zstd, one file per device key, day and writing process:

    <archive>/<device key>/<YYYY-MM-DD>/<host>-<pid>.jsonl.zst

(zstd frames appended; a file is read whole with `zstd -dc`). The archive is a local folder
(default: the farm's home, `archive/`) or any fsspec URL (a shared mount, `s3://...` with
s3fs installed). A lab whose workers should all read it gives them one shared location.

Nothing measured is lost: a record is removed from the spool only after its lines are
written (and flushed to disk, for a local folder), and only by the drainer that holds the
drain lease, exactly the batch it read (farm/store/spool.py); a crash between the two writes
them twice, and readers keep one per candidate. Redis stays the authority of what exists:
an archived copy is read only for the measurement its entry describes (its time and run
time, `packing.describes`), so a record the store has removed (`farm cache rm`), or an older
run of a candidate removed and measured again, is not read back. Retention keeps what the
store refers to (farm/store/retention.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timedelta, timezone

from farm.core.hostid import short_machine
from farm.store.packing import describes
from farm.store.spool import DRAIN_LEASE
from farm.store.store import ArchivedRecords, Entry, RecordReader, StoredRecord

log = logging.getLogger(__name__)

SUFFIX = ".jsonl.zst"
ID_FILE = ".archive-id"  # the archive's id (Archive.identity)
DRAIN_BATCH = 2000
DRAIN_LEASE_S = 120.0


def _safe(part: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in part) or "_"


class Archive:
    """The archive at `url` (a folder or an fsspec URL)."""

    def __init__(self, url: str):
        import fsspec

        self.url = url
        self.fs, self.root = fsspec.core.url_to_fs(url)
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple)
                                else (self.fs.protocol,))
        self.devices: dict[str, str] = {}  # workload key -> device key, as drain learns them

    def __repr__(self) -> str:
        return f"Archive({self.url!r})"

    def identity(self) -> str:
        """The archive's id: a random one its first user wrote into it (`.archive-id`). Hosts
        that share one archive read the same id, hosts with folders of their own (the same
        path on two machines) do not: `farm doctor` compares the ids the heartbeats carry.
        Raises OSError when the archive can be neither read nor written."""
        import uuid

        path = f"{self.root}/{ID_FILE}"
        with contextlib.suppress(FileNotFoundError):
            with self.fs.open(path, "rb") as f:
                found = f.read(64).decode(errors="replace").strip()
            if found:
                return found
        self.fs.makedirs(self.root, exist_ok=True)
        mine = uuid.uuid4().hex
        if self.local:  # made whole aside, then linked in only where none is (atomic, NFS too)
            aside = f"{path}.{mine}"
            with open(aside, "w") as f:
                f.write(mine)
            try:
                os.link(aside, path)
            except FileExistsError:
                pass  # another first user's stays
            finally:
                os.unlink(aside)
        else:
            with self.fs.open(path, "wb") as f:
                f.write(mine.encode())
        with self.fs.open(path, "rb") as f:  # two first users at once: the write that stayed
            return f.read(64).decode(errors="replace").strip()

    def append(self, device_key: str, records: list[StoredRecord],
               now: float | None = None) -> str:
        """Write records (one zstd frame) to this process's file of the day; returns its path."""
        return self.append_lines(device_key, [r.dumps() for r in records], now)

    def append_lines(self, device_key: str, lines: list[str], now: float | None = None) -> str:
        """`append` of records as their JSON lines."""
        import zstandard

        day = datetime.fromtimestamp(now or time.time(), timezone.utc).strftime("%Y-%m-%d")
        folder = f"{self.root}/{_safe(device_key)}/{day}"
        path = f"{folder}/{short_machine()}-{os.getpid()}{SUFFIX}"
        data = "".join(line + "\n" for line in lines).encode()
        frame = zstandard.ZstdCompressor(level=6).compress(data)
        self.fs.makedirs(folder, exist_ok=True)
        with self.fs.open(path, "ab") as f:
            f.write(frame)
            f.flush()
            if self.local:
                os.fsync(f.fileno())
        return path

    def files(self, device_key: str | None = None) -> list[str]:
        pattern = f"{self.root}/{_safe(device_key) if device_key else '*'}/*/*{SUFFIX}"
        return sorted(self.fs.glob(pattern))

    def lines(self, device_key: str | None = None,
              files: list[str] | None = None) -> Iterator[tuple[str, int, str]]:
        """Every archived line (path, line number, text) of a device key (or of `files`),
        oldest file first; an unreadable file is logged with its path and skipped."""
        for path in self.files(device_key) if files is None else files:
            text = self._text(path)
            for n, line in enumerate(text.splitlines() if text else [], 1):
                yield path, n, line

    def _text(self, path: str) -> str | None:
        import zstandard

        try:
            with self.fs.open(path, "rb") as f:
                reader = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
                return reader.read().decode()
        except (OSError, zstandard.ZstdError) as e:
            log.warning("archive: %s unreadable, skipped: %s", path, e)
            return None

    def records(self, device_key: str | None = None,
                workload_key: str | None = None) -> Iterator[StoredRecord]:
        """Every archived record (of a device key, of a workload), oldest file first; a
        corrupt line or file is logged with its path and skipped."""
        for path, n, line in self.lines(device_key):
            if workload_key and f'"workload_key": "{workload_key}"' not in line:
                continue
            rec = _parse(path, n, line)
            if rec is not None and (workload_key is None or rec.workload_key == workload_key):
                yield rec

    def prune(self, keep_days: float, now: float | None = None, *,
              keep: Callable[[str, int, str], bool]) -> list[str]:
        """Delete the days older than `keep_days` (0: keep everything); returns the folders.
        The lines `keep` accepts (path, line number, text) are first written into the day
        of `now` (farm/store/retention.py: what the store refers to); a day with a file
        that cannot be read is left for a later prune."""
        if keep_days <= 0:
            return []
        at = time.time() if now is None else now
        cutoff = datetime.fromtimestamp(at, timezone.utc) - timedelta(days=keep_days)
        gone = []
        for folder in sorted(self.fs.glob(f"{self.root}/*/*")):
            try:
                day = datetime.strptime(folder.rstrip("/").rsplit("/", 1)[-1], "%Y-%m-%d")
            except ValueError:
                continue
            if day.replace(tzinfo=timezone.utc) + timedelta(days=1) > cutoff:
                continue
            files = sorted(self.fs.glob(f"{folder}/*{SUFFIX}"))
            texts = {path: self._text(path) for path in files}
            if None in texts.values():
                continue
            kept = [line for path, text in texts.items()
                    for n, line in enumerate((text or "").splitlines(), 1) if keep(path, n, line)]
            if kept:
                self.append_lines(folder.rstrip("/").rsplit("/", 2)[-2], kept, at)
            self.fs.rm(folder, recursive=True)
            gone.append(folder)
        return gone


def _parse(path: str, n: int, line: str) -> StoredRecord | None:
    try:
        return StoredRecord.loads(line)
    except Exception as e:  # noqa: BLE001 - bad data is skipped, never fatal
        log.warning("archive: %s line %d corrupt, skipped: %s", path, n, e)
        return None


# what a cost model's sample needs of a line, read without parsing its trace (a record's
# JSON has sorted keys and these four are never inside its trace, a list of lists)
_KEY = re.compile(r'"(candidate|error_class|run_us|workload_key)": ("[^"\\]*"|null|[-0-9.eE+]+)')


def _fields(line: str) -> dict[str, str]:
    # sorted keys: candidate and error_class open the line, run_us and workload_key close it
    # (after the trace): only the two ends are searched
    ends = line if len(line) < 1024 else f"{line[:256]}\n{line[-512:]}"
    return {k: v.strip('"') for k, v in _KEY.findall(ends)}


def drain(store: ArchivedRecords, archive: Archive, owner: str = "",
          batch: int = DRAIN_BATCH) -> int:
    """Move the store's spool into the archive; returns the records moved (0 when another
    process is draining it now). The lease is renewed per batch; a batch leaves the spool
    only if this drainer still holds it (farm/store/spool.py): one that stalled past its
    lease stops, its records archived maybe twice, none lost."""
    if not store.spool_size():
        return 0  # nothing waits: no lease taken
    owner = owner or f"{short_machine()}:{os.getpid()}:{threading.get_ident()}"
    moved = 0
    try:
        while store.acquire_lease(DRAIN_LEASE, owner, DRAIN_LEASE_S) is None:
            got = store.spooled(batch)
            if not got.taken:
                break
            _write(store, archive, got.records)
            if not store.unspool(got, owner):
                log.warning("archive: drainer %s lost its lease (or its batch) while writing "
                            "%d records: it stops, another drainer goes on", owner, got.taken)
                break
            moved += len(got.records)
            if got.unreadable:
                log.warning("archive: %d unreadable records of the spool kept aside (%d now)",
                            len(got.unreadable), store.dead_letters())
            if got.taken < batch:
                break
    finally:
        store.release_lease(DRAIN_LEASE, owner)
    if moved:
        log.info("archive: %d records moved to %s", moved, archive.url)
    return moved


def _write(store: RecordReader, archive: Archive, records: list[tuple[str, str]]) -> None:
    """A batch of the spool into the archive, one append per device key."""
    devices = archive.devices  # a workload's device key never changes: read once
    by_key: dict[str, list[str]] = {}
    for wk, line in records:
        if wk not in devices:
            task = store.get_workload(wk)
            devices[wk] = task.device_key if task else "unknown"
        by_key.setdefault(devices[wk], []).append(line)
    for device_key, lines in by_key.items():
        archive.append_lines(device_key, lines)


_DRAINING = threading.Lock()


def _drain_for_reading(store: ArchivedRecords, archive: Archive) -> None:
    """Before reading the archive: what waits in the spool is written first (a reader of
    this process waits for another thread's drain to end rather than read around it)."""
    with _DRAINING:
        drain(store, archive)


def _copy_of(entry: Entry | None, rec: StoredRecord, have: StoredRecord | None) -> bool:
    """Is `rec` the archived copy to read for its candidate (over `have`)? Only a copy of
    the measurement the store's entry describes (its time and run time: not an older run
    of a candidate removed and measured again, nor an import a measurement replaced); of
    two such copies (a batch archived twice), the later in time, whatever their files."""
    return entry is not None and describes(entry, rec) and (
        have is None or rec.measured_at >= have.measured_at)


def is_copy(entries: Mapping[tuple[str, str], Entry], path: str, n: int, line: str) -> bool:
    """Is this archived line the copy of a measurement one of `entries` (by workload key and
    candidate) describes? The line is parsed only when its candidate is one of them."""
    f = _fields(line)
    entry = entries.get((f.get("workload_key", ""), f.get("candidate", "")))
    rec = None if entry is None else _parse(path, n, line)
    return rec is not None and _copy_of(entry, rec, None)


def archived(store: ArchivedRecords, archive: Archive, wk: str,
             candidate: str) -> StoredRecord | None:
    """One candidate's whole record from the archive (the spool drained first), None when
    the store has no entry of it or the archive lacks it."""
    entry = store.entry(wk, candidate)
    if entry is None:
        return None
    _drain_for_reading(store, archive)
    task = store.get_workload(wk)
    found = None
    for rec in archive.records(task.device_key if task else None, wk):
        if rec.candidate == candidate and _copy_of(entry, rec, found):
            found = rec
    return found


def all_records(store: ArchivedRecords, archive: Archive | None, wk: str) -> list[StoredRecord]:
    """Every record of a workload: Redis's whole ones and the archive's, one per candidate
    (only candidates the store still holds)."""
    return every_record(store, archive, [wk])[wk]


def _by_device_key(store: RecordReader, workloads: list[str]) -> dict[str | None, set[str]]:
    """The workloads grouped by their device key (None: the store no longer has the task): the
    archive is read one device key's folder at a time."""
    out: dict[str | None, set[str]] = {}
    for wk in workloads:
        task = store.get_workload(wk)
        out.setdefault(task.device_key if task else None, set()).add(wk)
    return out


def every_record(store: ArchivedRecords, archive: Archive | None,
                 workloads: list[str]) -> dict[str, list[StoredRecord]]:
    """`all_records` of many workloads, with one pass over each device key's archive (not
    one per workload)."""
    out = {wk: {r.candidate: r for r in store.records(wk)} for wk in workloads}
    held = {wk: {e.candidate: e for e in store.entries(wk)} for wk in workloads}
    cold = [wk for wk in workloads if not held[wk].keys() <= out[wk].keys()]
    if archive is None or not cold:  # every record is whole in Redis: no archive to read
        return {wk: list(recs.values()) for wk, recs in out.items()}
    _drain_for_reading(store, archive)
    found: dict[str, dict[str, StoredRecord]] = {wk: {} for wk in cold}
    for device_key, wks in _by_device_key(store, cold).items():
        for path, at, line in archive.lines(device_key):
            f = _fields(line)  # the record is parsed only when the store holds it and lacks it
            wk, cand = f.get("workload_key", ""), f.get("candidate", "")
            if wk not in wks or cand in out[wk] or cand not in held[wk]:
                continue
            rec = _parse(path, at, line)
            if rec is not None and _copy_of(held[wk][cand], rec, found[wk].get(cand)):
                found[wk][cand] = rec
    return {wk: [*recs.values(), *found.get(wk, {}).values()] for wk, recs in out.items()}


def each_record(store: ArchivedRecords, archive: Archive | None,
                workloads: list[str]) -> Iterator[StoredRecord]:
    """Every record of these workloads as `every_record` gives them, streamed: Redis's whole
    ones first, then the archive's as its lines are read, one pass per device key; only the
    entries of the records still to come are held, never the records (`farm cache export
    --all` of a store of millions)."""
    rest: dict[str, dict[str, Entry]] = {}
    for wk in workloads:
        hot = store.records(wk)
        yield from hot
        seen = {r.candidate for r in hot}
        cold = {e.candidate: e for e in store.entries(wk) if e.candidate not in seen}
        if cold:
            rest[wk] = cold
    if archive is None or not rest:
        return
    _drain_for_reading(store, archive)
    for device_key, wks in _by_device_key(store, list(rest)).items():
        for path, at, line in archive.lines(device_key):
            f = _fields(line)  # parsed only when its entry still waits for it
            wk, cand = f.get("workload_key", ""), f.get("candidate", "")
            entry = rest[wk].get(cand) if wk in wks else None
            if entry is None:
                continue
            rec = _parse(path, at, line)
            if rec is not None and _copy_of(entry, rec, None):  # the copy it describes
                del rest[wk][cand]
                yield rec


def wholes(store: ArchivedRecords, archive: Archive | None, device_key: str,
           wanted: dict[str, list[Entry]]) -> dict[str, dict[str, StoredRecord]]:
    """The whole records of the entries in `wanted` (per workload, candidate -> record):
    Redis's hot ones and the others in one pass over the device key's archive, parsing only
    the lines of wanted candidates (the copy each entry describes). A cost model picks its
    samples by their entries first, so it parses tens of records, not every one."""
    out = {wk: store.whole(wk, [e.candidate for e in ents]) for wk, ents in wanted.items()}
    missing = {wk: {e.candidate: e for e in ents if e.candidate not in out[wk]}
               for wk, ents in wanted.items()}
    missing = {wk: m for wk, m in missing.items() if m}
    if archive is None or not missing:
        return out
    _drain_for_reading(store, archive)
    for path, at, line in archive.lines(device_key):
        f = _fields(line)  # the record is parsed only when it is wanted
        entry = missing.get(f.get("workload_key", ""), {}).get(f.get("candidate", ""))
        rec = None if entry is None else _parse(path, at, line)
        if rec is not None and _copy_of(entry, rec, out[rec.workload_key].get(rec.candidate)):
            out[rec.workload_key][rec.candidate] = rec
    return out
