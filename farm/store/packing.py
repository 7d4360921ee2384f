"""How a measurement is kept in Redis: compactly (farm/store/redis/records.py).

Every measured candidate has an **entry** in its workload's records hash: what deduplication,
the best and accounting need, in tens of bytes (`<run us, 7 significant digits>|<failure
class>|<1 verified, 0 imported>|<tvm version>|<measured at, s, to 10 ms>`). The whole record
(its trace, for MetaSchedule) is kept in Redis only for the workload's K fastest valid
candidates and its best; every other one goes to the archive (farm/store/cold.py). A whole record is kept **compressed
with the workload's dictionary**: zlib with, as preset dictionary, the first record the
workload stored (its traces share most of their text: a 3.7 KB record takes ~0.2 KB).

A store written before this layout holds whole JSON records in the records hash; they are
read as they are (`{` first) and their entry is derived from them.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

from farm.store.store import Entry, StoredRecord

if TYPE_CHECKING:
    import numpy as np

ZDICT_BYTES = 32 * 1024  # zlib's window: a longer dictionary is not used
ZDICT_MIN = 1024  # a record shorter than this (TVM's default schedule: no trace) is no model
PACKED = b"z"  # a whole record compressed with its workload's dictionary
ALONE = b"y"  # a whole record compressed alone (its workload has no dictionary yet)
PLAIN = b"{"  # a whole record as JSON (the layout before; still read)


def entry_of(rec: StoredRecord) -> str:
    return _entry_text(Entry.of(rec))


def _entry_text(e: Entry) -> str:
    # 7 significant digits of the run time and the time to 10 ms keep a typical entry within
    # 44 characters: Redis allocates its value in jemalloc's 48-byte class, not the 64-byte
    # one (bench/fleet.md: bytes a measurement at 10M)
    us = f"{float(e.run_us):.7g}" if e.valid else ""  # type: ignore[arg-type]
    tvm = e.tvm.replace("|", "/")
    at = f"{e.measured_at:.2f}".rstrip("0").rstrip(".")  # a report's curve is in order
    return f"{us}|{e.error_class or ''}|{1 if e.verified else 0}|{tvm}|{at}"


def describes(entry: Entry, rec: StoredRecord) -> bool:
    """Is `rec` the measurement `entry` was made of (as far as an entry keeps it: its time to
    10 ms, its run time to 7 digits, its failure class, trust and TVM version)? An archived
    copy of a candidate removed and measured again, or replaced by a farm's measurement, is
    not."""
    return _entry_text(entry) == entry_of(rec)


def parse_entry(candidate: str, text: str) -> Entry:
    """An entry (or a whole JSON record of the layout before) as an Entry; ValueError when
    it is neither."""
    if text.startswith("{"):
        return Entry.of(StoredRecord.loads(text))
    us, cls, verified, tvm, at = text.split("|")
    return Entry(candidate, float(us) if us else None, cls or None, verified == "1", tvm,
                 float(at or 0))


def zdict_of(rec: StoredRecord) -> bytes | None:
    """The dictionary a workload's records are compressed with: the JSON of its first record
    that has a trace worth the name (None for one too short to be a model)."""
    text = rec.dumps().encode()
    return text[:ZDICT_BYTES] if len(text) >= ZDICT_MIN else None


def pack(rec: StoredRecord, zdict: bytes | None) -> bytes:
    if zdict is None:
        return ALONE + zlib.compress(rec.dumps().encode(), 6)
    c = zlib.compressobj(6, zlib.DEFLATED, 15, 9, zlib.Z_DEFAULT_STRATEGY, zdict)
    return PACKED + c.compress(rec.dumps().encode()) + c.flush()


def dictionary_id(blob: bytes) -> int | None:
    """The id of the dictionary a packed record needs (its Adler-32, which zlib writes in
    the stream's header), None when it needs none."""
    if blob[:1] != PACKED or len(blob) < 7 or not blob[2] & 0x20:  # FLG.FDICT
        return None
    return int.from_bytes(blob[3:7], "big")


def unpack_text(blob: bytes, zdict: bytes | None) -> str:
    """A whole record's JSON from what `pack` wrote (or a JSON record of the layout before)."""
    if blob[:1] == PLAIN:
        return blob.decode()
    if blob[:1] == ALONE:
        return zlib.decompress(blob[1:]).decode()
    if blob[:1] != PACKED or zdict is None:
        raise ValueError("not a packed record, or its workload has no dictionary")
    d = zlib.decompressobj(15, zdict)
    return (d.decompress(blob[1:]) + d.flush()).decode()


def unpack(blob: bytes, zdict: bytes | None) -> StoredRecord:
    """A whole record from what `pack` wrote (or a JSON record of the layout before)."""
    return StoredRecord.loads(unpack_text(blob, zdict))


def squeeze(data: str | bytes) -> bytes:
    """A large text kept once (a workload's TIR, a cost model's booster), compressed."""
    return PACKED + zlib.compress(data.encode() if isinstance(data, str) else data, 6)


def unsqueeze_bytes(blob: bytes) -> bytes:
    return zlib.decompress(blob[1:]) if blob[:1] == PACKED else blob


def unsqueeze(blob: bytes) -> str:
    return unsqueeze_bytes(blob).decode()


FEATURES = b"h"  # a feature matrix as float16, zlib: what Redis keeps of a cost-model input


def feature_matrix(text: str) -> np.ndarray | None:
    """A record's cost-model features as the store keeps them ("rows:cols:" + base64 of zlib
    of float32, workers/round/samples.encode) as a matrix; None for a record without."""
    if not text:
        return None
    import base64

    import numpy as np

    rows, cols, data = text.split(":", 2)
    raw = zlib.decompress(base64.b64decode(data))
    return np.frombuffer(raw, dtype=np.float32).reshape(int(rows), int(cols))


def pack_features(text: str) -> bytes:
    """A record's cost-model features ("rows:cols:" + base64 of zlib of float32, as
    workers/round/samples.encode writes them) kept as float16 bytes: 0.3 KB, not 0.6 KB.
    MetaSchedule's per-store features are mostly log2(1 + x) values; float16 keeps them to
    a relative 5e-4. Empty text (a record without features) stays empty."""
    if not text:
        return b""
    import base64

    import numpy as np

    try:
        rows, cols, data = text.split(":", 2)
        x = np.frombuffer(zlib.decompress(base64.b64decode(data)), dtype=np.float32)
        head = f"{int(rows)}:{int(cols)}:".encode()
    except (ValueError, zlib.error):  # not a feature matrix: kept as the text it is
        return squeeze(text)
    if x.size and not (np.isfinite(x).all() and float(np.abs(x).max()) < 60000.0):
        return squeeze(text)  # beyond float16: kept whole
    return FEATURES + head + zlib.compress(x.astype(np.float16).tobytes(), 9)


def unpack_features(blob: bytes) -> str:
    """The text `pack_features` was given (float32 again, rounded to float16)."""
    if blob[:1] != FEATURES:
        return unsqueeze(blob)  # kept as text before
    import base64

    import numpy as np

    rows, cols, data = blob[1:].split(b":", 2)
    x = np.frombuffer(zlib.decompress(data), dtype=np.float16).astype(np.float32)
    return (f"{int(rows)}:{int(cols)}:"
            + base64.b64encode(zlib.compress(x.tobytes(), 6)).decode())
