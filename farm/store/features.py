"""The cost model's features of each record, cached on the worker host's disk, not in Redis.

A record's features (MetaSchedule's per-store features, workers/metaschedule/costmodel.py) are
derived data: the same trace on the same workload always gives the same matrix. Redis keeps
what the farm cannot recompute; a host keeps the features it computed, in one SQLite file
of its home (`<home>/features.sqlite`), packed as float16 (farm/store/packing.py), and
computes those it lacks when the key's model trains (at most FEATURIZE_LIMIT a training).
Safe across the processes of a host (SQLite's locking); a corrupt or unwritable file is
logged and the cache starts empty: a cache never fails a round.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

from farm.store.packing import pack_features, unpack_features

log = logging.getLogger(__name__)


class LocalFeatures:
    def __init__(self, path: Path | str):
        self.path = Path(path)
        self._local = threading.local()

    def __getstate__(self) -> dict[str, str]:
        return {"path": str(self.path)}

    def __setstate__(self, state: dict[str, str]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]

    def _db(self) -> sqlite3.Connection | None:
        db = getattr(self._local, "db", None)
        if db is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                db = sqlite3.connect(self.path, timeout=30)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("CREATE TABLE IF NOT EXISTS features (wk TEXT, cand TEXT, x BLOB, "
                           "PRIMARY KEY (wk, cand))")
            except (OSError, sqlite3.Error) as e:
                log.warning("features cache %s not usable, features are computed again: %s",
                            self.path, e)
                return None
            self._local.db = db
        return db

    def get(self, wk: str) -> dict[str, str]:
        db = self._db()
        if db is None:
            return {}
        try:
            rows = db.execute("SELECT cand, x FROM features WHERE wk = ?", (wk,)).fetchall()
        except sqlite3.Error as e:
            log.warning("features cache %s: %s", self.path, e)
            return {}
        return {cand: unpack_features(bytes(x)) for cand, x in rows}

    def put(self, wk: str, features: dict[str, str]) -> None:
        db = self._db()
        if db is None or not features:
            return
        try:
            with db:
                db.executemany("INSERT OR REPLACE INTO features VALUES (?, ?, ?)",
                               [(wk, c, pack_features(v)) for c, v in features.items()])
        except sqlite3.Error as e:
            log.warning("features cache %s: not written: %s", self.path, e)

    def forget(self, wk: str) -> None:
        db = self._db()
        if db is not None:
            try:
                with db:
                    db.execute("DELETE FROM features WHERE wk = ?", (wk,))
            except sqlite3.Error as e:
                log.warning("features cache %s: %s", self.path, e)
