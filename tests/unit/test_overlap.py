"""How many rounds a worker host runs at once (workers/round/gate.py): from the measured speeds of
its phones and of itself, one at a time where fast phones share its CPU."""

from __future__ import annotations

import socket

from farm.core.config import load_config
from farm.core.cores import usable_cores
from farm.devices.tracker import this_host_addresses
from workers.round.gate import Gate, pool_size, rounds_at_once


def test_two_rounds_keep_the_slower_side_busy_one_where_fast_phones_share_the_cpu():
    # 4 phones at 1 s a measurement: a batch of 16 takes them 4 s; the host builds one in 2 s
    n, why = rounds_at_once(1.0, 4, 2.0, host_cpu=True, pool=4)
    assert n == 2 and "measure a batch in 4.0 s" in why and "the phones the slower" in why
    assert rounds_at_once(1.0, 4, 2.0, host_cpu=False, pool=4)[0] == 2
    n, why = rounds_at_once(0.1, 8, 2.0, host_cpu=False, pool=4)  # the host is the slower
    assert n == 2 and "the host the slower" in why
    assert rounds_at_once(1.0, 4, 2.0, host_cpu=False, pool=1)[0] == 1  # at most the pool
    # emulated phones faster than the host: one at a time, clean measurements
    n, why = rounds_at_once(0.05, 2, 3.0, host_cpu=True, pool=4)
    assert n == 1 and "clean" in why
    assert rounds_at_once(None, 2, None, host_cpu=True, pool=4)[0] == 1  # nothing measured yet
    assert rounds_at_once(None, 2, None, host_cpu=False, pool=4)[0] == 2
    assert [pool_size(k) for k in (0, 1, 2, 3, 5)] == [2, 2, 4, 6, 6]
    # room for the rounds lent to helper hosts, beyond the host's own
    assert [pool_size(k, lends=True) for k in (0, 1, 3)] == [2, 4, 8]


def test_the_gate_opens_as_many_slots_as_decided_and_learns_the_host_speed(tmp_path):
    gate = Gate(str(tmp_path / "gate"), pool=3)
    assert gate.host_s() is None
    cores = usable_cores()  # the worker's, not the machine's (farm/core/cores.py)
    gate.note_host_s(12.0 * cores, 4)  # CPU seconds of the whole host
    gate.note_host_s(6.0 * cores, 3)
    assert abs(gate.host_s() - (0.7 * 3.0 + 0.3 * 2.0)) < 1e-9
    other = Gate(str(tmp_path / "gate"), pool=3)  # another pool process of the same worker
    with gate.slot("k", lambda: 2) as a, other.slot("k", lambda: 2) as b, \
            gate.slot("other-key", lambda: 1) as own:  # each key has slots of its own
        assert own == 0
        assert {a, b} == {0, 1}
        asked = []

        def decide() -> int:  # the third waits until the gate opens a third slot
            asked.append(1)
            return 2 if len(asked) < 3 else 3

        with other.slot("k", decide, every_s=0.01) as c:
            assert c == 2 and len(asked) == 3


def test_a_freed_slot_is_taken_at_once_not_at_the_next_decision(tmp_path, monkeypatch):
    """A round waiting at the gate takes the slot a finished round frees without waiting for
    the gate's next decision (every_s: it asks the tracker and the store, once a second in a
    worker): the phones would idle meanwhile."""
    import threading
    import time

    real_sleep, slept = time.sleep, []

    def sleep(s: float) -> None:  # the waiter's sleeps are noted and cut short
        if threading.current_thread().name == "waiter":
            slept.append(s)
            s = min(s, 0.2)
        real_sleep(s)

    monkeypatch.setattr(time, "sleep", sleep)
    gate, other = Gate(str(tmp_path / "gate"), pool=2), Gate(str(tmp_path / "gate"), pool=2)
    asked, got = [], []

    def waiter() -> None:
        def decide() -> int:
            asked.append(1)
            return 1

        with other.slot("k", decide, every_s=3600) as i:
            got.append(i)

    with gate.slot("k", lambda: 1):
        thread = threading.Thread(target=waiter, name="waiter", daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while not slept and thread.is_alive() and time.monotonic() < deadline:
            thread.join(0.01)  # until the waiter found the one open slot taken, and waits
        assert slept and not got, (slept, got)
    thread.join(60)
    assert got == [0]
    assert len(asked) == 1  # taken before the gate decided again
    assert max(slept) <= 0.1  # it tried again within a tenth of a second, not every_s


def test_this_hosts_addresses_include_its_name():
    assert socket.gethostname() in this_host_addresses()


def test_concurrency_is_automatic_by_default_and_search_threads_follow_it():
    cfg = load_config(env={})
    assert cfg.worker_concurrency == 0 and cfg.search_threads >= 1
    two = load_config(env={"FARM_WORKER_CONCURRENCY": "2", "FARM_SEARCH_CORES": "0"})
    assert two.search_threads == max(1, usable_cores() // 2)
    assert load_config(env={"FARM_SEARCH_CORES": "3"}).search_threads == 3


def test_a_round_waiting_for_a_slot_gives_up_when_told(tmp_path):
    """A round that waits at the gate while another host of the key idles is handed over
    (-1) instead of waiting here for a slot: it holds none."""
    gate = Gate(str(tmp_path / "gate"), pool=2)
    other = Gate(str(tmp_path / "gate"), pool=2)
    asked: list[int] = []

    def idle_elsewhere() -> bool:
        asked.append(1)
        return len(asked) >= 2

    with gate.slot("k", lambda: 1) as a:  # one at a time (emulated phones on the host's CPU)
        assert a == 0
        with other.slot("k", lambda: 1, every_s=0.05, give_up=idle_elsewhere) as c:
            assert c == -1 and len(asked) == 2
            assert gate.running("k") == 1  # the one that gave up holds nothing
    with gate.slot("k", lambda: 1, give_up=lambda: True) as d:
        assert d == 0  # a free slot is taken before anything is asked


def test_a_rounds_search_threads_follow_where_its_phones_run(tmp_path):
    """Phones of their own: a round searches on the host's cores / the keys served (its
    key's other round has its batch on the phones meanwhile); phones on this host's CPU:
    the cores / the rounds at once, leaving cores to measure on."""
    from farm.core.profiles import DeviceProfile
    from workers.round.context import WorkerContext
    from workers.round.gate import Gate

    ctx = WorkerContext(config=load_config(env={"FARM_SEARCH_CORES": "0"}), tracker="t:1")
    ctx.gate, ctx.rounds_at_once = Gate(str(tmp_path / "one-key"), pool=2), 2
    llvm = {"kind": "llvm"}
    phone, emulated = DeviceProfile("p", llvm), DeviceProfile("e", llvm, host_cpu=True)
    assert ctx.search_threads(phone) == usable_cores()
    assert ctx.search_threads(emulated) == max(1, usable_cores() // 2)
    ctx.gate = Gate(str(tmp_path / "three-keys"), pool=6)
    assert ctx.search_threads(phone) == max(1, usable_cores() // 3)
    ctx.gate = None  # a fixed --concurrency: the config's cores / the pool
    assert ctx.search_threads(phone) == ctx.config.search_threads
