"""Worker hosts as the farm sees them: each advertises itself with an expiring heartbeat."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from farm.core import keys
from farm.core.messages import _Message


@dataclass(frozen=True)
class HostBeat(_Message):
    """One worker host's heartbeat: its tracker and the phones on it, per device key."""

    kind = "host heartbeat"
    name: str
    tracker: str
    phones: dict[str, dict[str, int]] = field(default_factory=dict)  # key -> total/free/busy
    queues: list[str] = field(default_factory=list)
    pid: int = 0
    started_at: float = 0.0
    beat_at: float = 0.0
    cpu: str = ""  # LLVM's name of the host's CPU (what its emulated phones run on)


def publish(redis_client: Any, beat: HostBeat, ttl_s: int | None = None) -> None:
    """The host's heartbeat, expiring after `ttl_s` (default FARM_HOST_TTL_S, read now)."""
    redis_client.set(keys.host(beat.name), beat.dumps(),
                     ex=ttl_s if ttl_s is not None else keys.HOST_TTL_S)


def remove(redis_client: Any, name: str) -> None:
    redis_client.delete(keys.host(name))


def list_hosts(redis_client: Any) -> list[HostBeat]:
    out = []
    for key in sorted(redis_client.scan_iter(match=keys.host_pattern(), count=100)):
        raw = redis_client.get(key)
        if raw is None:
            continue
        try:
            out.append(HostBeat.loads(raw))
        except Exception:  # noqa: BLE001 - a bad heartbeat is reported, not fatal
            out.append(HostBeat(name=str(key), tracker="?", phones={}))
    return out


def format_hosts(hosts: list[HostBeat]) -> str:
    if not hosts:
        return "no worker host has a heartbeat (start one with `farm worker --tracker ...`)"
    lines = [f"{'host':28} {'tracker':22} {'device key':16} {'total':>5} {'free':>5} {'busy':>5}  "
             f"last heartbeat"]
    now = time.time()
    for h in hosts:
        age = f"{now - h.beat_at:.0f} s ago"
        if not h.phones:
            lines.append(f"{h.name:28} {h.tracker:22} {'-':16} {0:5} {0:5} {0:5}  {age}")
        for key, c in sorted(h.phones.items()):
            lines.append(f"{h.name:28} {h.tracker:22} {key:16} {c.get('total', 0):5} "
                         f"{c.get('free', 0):5} {c.get('busy', 0):5}  {age}")
    return "\n".join(lines)


