"""Worker hosts as the farm sees them: each advertises itself with an expiring heartbeat
(kept by the store: `RecordStore.publish_host` / `hosts`)."""

from __future__ import annotations

import time
from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Protocol

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
    addresses: dict[str, list[str]] = field(default_factory=dict)  # key -> its phones' host:port
    rounds: dict[str, int] = field(default_factory=dict)  # key -> its rounds running (gated hosts)
    cores: int = 0  # the cores this host's rounds may use
    # key -> the cores its rounds' search, builds and measuring client need to keep the key's
    # phones busy, from the rounds this host ran (workers/round/gate.py; absent: not measured)
    cores_needed: dict[str, float] = field(default_factory=dict)
    machine: str = ""  # host name, boot id and PID namespace of its process (farm/jobs/fence.py)
    archive: str = ""  # where its records leave Redis to (passwords redacted)
    archive_id: str = ""  # that archive's id (farm/store/cold.Archive.identity); "" unreadable
    archive_error: str = ""  # why the archive could not be read or written
    searches: int = 0  # a helper host's search sessions at once (`farm worker --helper`)


def registered_phones(hosts: list[HostBeat], key: str) -> dict[str, str]:
    """The phones of `key` on the live hosts' trackers: phone address -> worker host."""
    return {phone: h.name for h in hosts for phone in h.addresses.get(key, [])}


def format_hosts(hosts: list[HostBeat]) -> str:
    if not hosts:
        return "no worker host has a heartbeat (start one with `farm worker --tracker ...`)"
    lines = [f"{'host':28} {'tracker':22} {'device key':16} {'total':>5} {'free':>5} {'busy':>5}  "
             f"last heartbeat"]
    now = time.time()
    for h in hosts:
        age = f"{now - h.beat_at:.0f} s ago"
        if not h.phones:
            tracker = h.tracker or "(helper: searches)"  # farm worker --helper
            lines.append(f"{h.name:28} {tracker:22} {'-':16} {0:5} {0:5} {0:5}  {age}")
        for key, c in sorted(h.phones.items()):
            lines.append(f"{h.name:28} {h.tracker:22} {key:16} {c.get('total', 0):5} "
                         f"{c.get('free', 0):5} {c.get('busy', 0):5}  {age}")
    short = [line for h in hosts for line in short_of_cores(h)]
    return "\n".join(lines + ([""] + short if short else []))


def short_of_cores(h: HostBeat) -> list[str]:
    """A line per device key whose phones wait for this host's cores: the cores its search and
    builds need to keep them busy, the cores it has, how idle that leaves the phones, the fix."""
    out = []
    for key, need in sorted(h.cores_needed.items()):
        if h.cores and need > h.cores:
            out.append(f"host {h.name} is short of cores for its phones of {key}: their search "
                       f"and builds need ~{need:.1f} cores to keep them busy, it has {h.cores}; "
                       f"they idle ~{100 * (1 - h.cores / need):.0f} % of the time for want of "
                       f"CPU (fix: `farm worker --helper` on another machine lends it cores, "
                       f"or move some phones to another host)")
    return out


class HostRegistry(Protocol):
    """Live worker hosts. Contract: a heartbeat lives `ttl_s` unless published again; `hosts`
    lists the live ones by name, an unreadable one as a placeholder (tracker "?")."""

    @abstractmethod
    def publish_host(self, beat: HostBeat, ttl_s: float) -> None:
        """A host's heartbeat, gone after `ttl_s` unless published again."""

    @abstractmethod
    def remove_host(self, name: str) -> None: ...

    @abstractmethod
    def hosts(self) -> list[HostBeat]:
        """Every live host's heartbeat, by name; an unreadable one as a placeholder (the
        tracker "?"), so a bad heartbeat is seen rather than hidden."""
