"""How many rounds of a device key a worker host runs at once, decided from what limits it.

A round alternates between host work (search and build, on the host's cores) and phone
work (its batch measured on the phones). One round at a time leaves the phones idle during
the host work and the host idle while the phones measure. Measured per key:

- *phone time per batch* M = BATCH x the key's mean measurement time / its phones
  (the phones' busy seconds in the store);
- *host time per batch* H = the CPU seconds one batch's search and build take on this host
  (the round's process and its build processes) / its cores: the time the whole host needs
  for a batch, whatever else ran at the same time (a moving mean over the rounds it ran
  since the worker started, kept in the gate's directory).

A round is H then M (the phones serve a key's batches one after the other, oldest first:
workers/metaschedule/turns.py). Whichever is longer is the bottleneck, and two rounds in flight keep it
busy all the time: while one round is on the bottleneck, the other does its shorter part and
is ready when the bottleneck frees. More rounds add nothing but contention (bench/scaling.md,
2026-12-02: 1 + ceil(H / M) rounds on a host-bound 2-core host with 8 phones ran 5 at once and
was slower than 4 phones). So: 2 rounds of a key at once, except one where measurement must
stay clean: phones that run on this host's CPU (a `host_cpu` profile: emulated phones) and
measure faster than the host builds (M < H) share its cores with the search, and the host is
the bottleneck anyway, so their rounds run one at a time. Before anything is measured: one
for such phones, two otherwise.

A host that lends its rounds' search to helper hosts (workers/round/lend/phone_side.py) runs more:
its own two, and one more per helper session it holds or a helper has free (the helpers'
cores search those; this host only measures them), LEND_ROUNDS more at most.

The Celery pool of the worker has room for two rounds per key it serves and LEND_ROUNDS
more when its rounds may lend (`pool_size`); each round takes a slot of its key at the gate
(a file lock per slot, released by the kernel if its process dies) and only the first
`rounds_at_once` slots of the key are open.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from farm.core.cores import usable_cores

if TYPE_CHECKING:
    from farm.store.phones import PhoneLedger

MAX_POOL = 6  # a worker's own rounds (lent ones come on top)
LEND_ROUNDS = 2  # rounds a host runs beyond its own two while helpers search them


def pool_size(keys: int, lends: bool = False) -> int:
    """The worker's Celery concurrency when automatic: two rounds per key it serves, and
    LEND_ROUNDS more when its rounds may lend their search to helpers."""
    return max(2, min(MAX_POOL, 2 * keys)) + (LEND_ROUNDS if lends and keys else 0)


def rounds_at_once(phone_s: float | None, phones: int, host_s: float | None, host_cpu: bool,
                   pool: int) -> tuple[int, str]:
    """(rounds of a key at once, why) from the mean measurement time (s) of the key's phones,
    their number, this host's time per batch (s, all its cores), and whether the phones
    share its CPU."""
    if phone_s is None or host_s is None or host_s <= 0:
        return (1, "phones on this host's CPU, not measured yet") if host_cpu else (
            min(2, pool), "not measured yet")
    # here: workers.round.loop loads TVM, and the heartbeat reads the gate without it
    from workers.round.loop import BATCH

    per_batch = BATCH * phone_s / max(1, phones)
    if host_cpu and per_batch < host_s:
        return 1, (f"phones on this host's CPU measure a batch in {per_batch:.1f} s, faster "
                   f"than it builds one ({host_s:.1f} s): one at a time, clean measurement")
    slower = "the phones" if per_batch >= host_s else "the host"
    return min(2, pool), (f"phones measure a batch in {per_batch:.1f} s, the host builds one "
                          f"in {host_s:.1f} s: {slower} the slower, kept busy by two")


def cores_needed(host_s: float | None, phone_s: float | None, phones: int) -> float | None:
    """The cores a host's rounds need to keep `phones` phones of a key busy: the CPU seconds
    of a batch (`host_s`, whole-host seconds per batch, times the host's cores) over the
    phones' time to measure one (BATCH x their mean measurement time `phone_s` / phones).
    None: not measured yet."""
    if host_s is None or phone_s is None or phones <= 0 or host_s <= 0 or phone_s <= 0:
        return None
    # here: workers.round.loop loads TVM, and the heartbeat reads the gate without it
    from workers.round.loop import BATCH

    return host_s * usable_cores() / (BATCH * phone_s / phones)


class Gate:
    """The worker's open round slots, shared by its pool processes through files in `path`
    (a directory of its own per `farm worker`, made by it and removed when it stops)."""

    def __init__(self, path: str, pool: int) -> None:
        self.dir = path
        self.pool = pool
        os.makedirs(self.dir, exist_ok=True)
        self._lend_room: int | None = None

    @property
    def lend_room(self) -> int:
        """The pool's slots for rounds lent to helpers (beyond the host's own rounds)."""
        if self._lend_room is None:
            try:
                with open(os.path.join(self.dir, "lend"), encoding="utf-8") as f:
                    self._lend_room = int(f.read())
            except (OSError, ValueError):
                self._lend_room = 0
        return self._lend_room

    def set_lend_room(self, rounds: int) -> None:
        """Said once by the worker before its pool starts."""
        with open(os.path.join(self.dir, "lend"), "w", encoding="utf-8") as f:
            f.write(str(rounds))
        self._lend_room = rounds

    @contextlib.contextmanager
    def slot(self, key: str, open_slots: Callable[[], int], every_s: float = 1.0,
             try_s: float = 0.05, give_up: Callable[[], bool] | None = None) -> Iterator[int]:
        """Hold one of the first `open_slots()` slots of `key` while the round runs; waits for
        one, trying the open slots every `try_s` (a slot freed by a round that ended is taken
        at once: the phones wait on this) and asking `open_slots()` again every `every_s`
        (the speeds change as rounds end; it asks the tracker and the store). A round waiting
        here asks `give_up` too, every `every_s`: True yields -1 and holds nothing (another
        host of the key is idle: the round goes there instead of waiting here)."""
        name = key.replace("/", "_")
        opened, asked = 1, -every_s
        while True:
            if time.monotonic() - asked >= every_s:
                if asked >= 0 and give_up is not None and give_up():
                    yield -1
                    return
                opened, asked = max(1, min(open_slots(), self.pool)), time.monotonic()
            for i in range(opened):
                f = open(os.path.join(self.dir, f"slot-{name}-{i}"), "a")  # noqa: SIM115
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    f.close()
                    continue
                try:
                    yield i
                finally:
                    fcntl.flock(f, fcntl.LOCK_UN)
                    f.close()
                return
            time.sleep(try_s)

    def running(self, key: str) -> int:
        """Rounds of `key` holding a slot now: each slot's lock tried, never waited for (a
        round taking a slot that moment tries it again in `slot`'s next pass)."""
        name = key.replace("/", "_")
        held = 0
        for path in glob.glob(os.path.join(self.dir, f"slot-{glob.escape(name)}-*")):
            with open(path, "a") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    held += 1
                    continue
                fcntl.flock(f, fcntl.LOCK_UN)
        return held

    def first_to(self, what: str) -> bool:
        """True for the first pool process that asks (once per worker and `what`)."""
        try:
            os.close(os.open(os.path.join(self.dir, f"first-{what}"),
                             os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    def host_s(self) -> float | None:
        """This host's mean host time per batch (None: no round measured yet)."""
        try:
            with open(os.path.join(self.dir, "host.json"), encoding="utf-8") as f:
                return float(json.load(f)["host_s"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def note_host_s(self, cpu_s: float, batches: int) -> None:
        """Add a round's CPU seconds over its batches (as whole-host seconds: / cores): a
        moving mean, so the host's speed follows the workloads' size."""
        if batches <= 0 or cpu_s <= 0:
            return
        now = cpu_s / batches / usable_cores()
        old = self.host_s()
        mean = now if old is None else 0.7 * old + 0.3 * now
        tmp = os.path.join(self.dir, f"host.json.{os.getpid()}")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"host_s": mean}, f)
        os.replace(tmp, os.path.join(self.dir, "host.json"))


def phone_speed(store: PhoneLedger, key: str, on_tracker: tuple[str, ...]) -> float | None:
    """The mean measurement time (s) of the key's phones on this host's tracker (None: none
    of them has measured yet)."""
    mine = [s for s in store.phone_stats() if s.key == key and s.phone in on_tracker]
    n = sum(s.measurements for s in mine)
    return sum(s.busy_s for s in mine) / n if n else None
