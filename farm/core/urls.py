"""The farm's Redis URLs: one Redis, or a primary watched by Sentinel (pure: no I/O).

    redis://[:PASSWORD@]HOST:PORT/DB           one Redis (rediss://: TLS; unix://PATH)
    sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/DB?master=NAME
                                               the primary Sentinel names NAME, found through
                                               any of the sentinels listed; after a failover
                                               every client follows the promoted replica

PASSWORD is the Redis nodes' password and the sentinels' (`requirepass` in both). Celery
and kombu get the same farm in their own form (`celery_broker`); farm/store/redis/url.py
opens the connections.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, quote, unquote

from farm.core.aliases import JsonDict

SCHEME = "sentinel"


def is_sentinel(url: str) -> bool:
    return url.startswith(f"{SCHEME}://")


@dataclass(frozen=True)
class SentinelURL:
    sentinels: tuple[tuple[str, int], ...]
    master: str
    password: str | None
    db: int


def parse_sentinel(url: str) -> SentinelURL:
    """The parts of a sentinel:// URL; ValueError saying what is wrong."""
    scheme, sep, rest = url.partition("://")
    if scheme != SCHEME or not sep:
        raise ValueError("a Sentinel URL starts with sentinel://")
    auth, at, tail = rest.rpartition("@")
    password = unquote(auth.partition(":")[2]) if at and ":" in auth else None
    netloc, _, after = tail.partition("/")
    netloc, _, query = netloc.partition("?")
    path, _, query2 = after.partition("?")
    query = query or query2
    sentinels = []
    for item in filter(None, netloc.split(",")):
        host, colon, port = item.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{item!r} is not HOST:PORT of a sentinel")
        sentinels.append((host.strip("[]"), int(port)))
    if not sentinels:
        raise ValueError("it names no sentinel (HOST:PORT[,HOST:PORT...])")
    master = parse_qs(query).get("master", [""])[0]
    if not master:
        raise ValueError("it names no primary: add ?master=NAME (Sentinel's name of it)")
    db = path.strip("/")
    if db and not db.isdigit():
        raise ValueError(f"the database after the sentinels must be a number, not {db!r}")
    return SentinelURL(tuple(sentinels), master, password or None, int(db or 0))


def celery_broker(url: str) -> tuple[str, JsonDict]:
    """The URL Celery and kombu take for the farm's, and the transport options it needs
    (Sentinel: one sentinel:// URL per sentinel joined by ";", and the primary's name)."""
    if not is_sentinel(url):
        return url, {}
    s = parse_sentinel(url)
    auth = f":{quote(s.password, safe='')}@" if s.password else ""
    joined = ";".join(f"{SCHEME}://{auth}{host}:{port}/{s.db}" for host, port in s.sentinels)
    options: JsonDict = {"master_name": s.master}
    if s.password:
        options["sentinel_kwargs"] = {"password": s.password}
    return joined, options
