"""A job's tail spread over the hosts: a round hands the rest of its trials to an idle host.

A round is a unit of one host: its tracker, its phones. At a job's end the last rounds of a
key can all sit on one host, two at once, while another host of the key has nothing left to
take and its phones idle (bench/scaling.md, 2026-12-04: 10 rounds went 6 to one host and 4
to the other; the second host's phones waited out the first's last round). So before each
batch after its first, a round asks `hand_to`; it ends after the batches it measured, and
the workload's next round (the trials still missing) goes to the key's queue, when

- this host runs two or more rounds of the key (its gate's held slots: workers/round/gate.py),
- another live host with phones of the key runs none (its heartbeat's `rounds`),
- nothing waits in the key's queue (that host would take it anyway), and
- the job has per-task budgets (a job budget's planner hands out its rounds itself).

A round still waiting at its host's gate for a slot asks the same, and is handed over whole
(workers/round/measure.py `_slot`): a host's pool takes two rounds of a key when its gate may
open only one.

One round hands off per idle host until that host's next heartbeat can show it busy (a
claim in the store), and the round's worker holds its pool slot `HOLD_S` longer, so the
idle host, not this one, takes the remainder. A host with a fixed `--concurrency` has no
gate: it neither hands off nor is handed to (its heartbeat has no `rounds`); a worker with
`round_handoff = 0` (FARM_ROUND_HANDOFF=0) never hands off.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from farm.core import keys
from farm.core.messages import RoundRequest
from farm.jobs.dispatch import queued_rounds
from farm.store.hosts import HostRegistry
from farm.store.store import FarmView
from workers.round.context import WorkerContext

log = logging.getLogger(__name__)

HOLD_S = 3.0  # a handing-off round's worker stays busy this long (the idle host polls each 1 s)


def idle_hosts(store: HostRegistry, key: str, me: str) -> list[str]:
    """The other live hosts with phones of `key` that run no round of it (their heartbeats)."""
    return [h.name for h in store.hosts() if h.name != me and h.rounds.get(key) == 0
            and h.phones.get(key, {}).get("total", 0) > 0]


def hand_to(ctx: WorkerContext, store: FarmView, req: RoundRequest) -> str | None:
    """The idle host this round should hand the rest of its trials to, claimed; None: go on."""
    if ctx.gate is None or ctx.gate.running(req.device_key) < 2:
        return None
    idle = idle_hosts(store, req.device_key, ctx.host)
    if not idle:
        return None
    if queued_rounds(ctx.broker(), req.device_key):
        return None
    claim_s = max(2.0, 2 * ctx.config.host_ttl_s / 3)  # until its next beats show it busy
    for name in idle:
        if store.claim(keys.handoff(req.device_key, name), ttl_s=claim_s):
            return name
    return None


def checker(ctx: WorkerContext, store: FarmView, req: RoundRequest) -> Callable[[], bool] | None:
    """What the round's search asks before each batch after its first: True ends the round
    (its rest goes to an idle host). None: this round never hands off."""
    if ctx.gate is None or not ctx.config.round_handoff:
        return None
    job = store.get_job(req.job_id)
    if job is None or job.trials_budget:
        return None

    def check() -> bool:
        try:
            to = hand_to(ctx, store, req)
        except Exception as e:  # noqa: BLE001 - a failed look only keeps the round going
            log.warning("round %s: could not look for idle hosts: %s", req.round_id, e)
            return False
        if to is not None:
            log.info("round %s of %s on %s: %s has no round of %s: handing it the rest",
                     req.round_index + 1, req.task_name, ctx.host, to, req.device_key)
        return to is not None

    return check
