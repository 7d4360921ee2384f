"""The store contract, the coordination protocol (farm/store/coordination.py): flags, budgets, leases, fences, the leader: run against every implementation (in-memory and real Redis)."""

import pytest

from farm.core import keys


def test_claim_once(store):
    assert store.claim(keys.round_sent("r1"))
    assert not store.claim(keys.round_sent("r1"))
    assert store.claim(keys.round_sent("r2"), ttl_s=60)


def test_lease_one_holder_at_a_time_and_expiry(store):
    import time

    assert store.acquire_lease("wk", "job1", ttl_s=0.5) is None
    assert store.acquire_lease("wk", "job1", ttl_s=0.5) is None  # renew by its holder
    assert store.acquire_lease("wk", "job2", ttl_s=0.5) == "job1"
    store.release_lease("wk", "job2")  # not the holder: nothing happens
    assert store.acquire_lease("wk", "job2", ttl_s=0.5) == "job1"
    time.sleep(0.7)  # a dead holder's lease expires
    assert store.acquire_lease("wk", "job2", ttl_s=5) is None
    store.release_lease("wk", "job2")
    assert store.acquire_lease("wk", "job3", ttl_s=5) is None


def test_allocate_never_exceeds_the_budget(store):
    assert store.allocate("j", 4, 10) == 4
    assert store.allocate("j", 4, 10) == 4
    assert store.allocate("j", 4, 10) == 2
    assert store.allocate("j", 4, 10) == 0
    assert store.allocate("other", 3, 10) == 3


def test_a_round_runs_as_one_copy_and_never_after_it_is_done(store):
    assert store.acquire_round("r", "copy1", ttl_s=30) is None
    assert store.acquire_round("r", "copy1", ttl_s=30) is None  # renewed by its holder
    assert store.acquire_round("r", "copy2", ttl_s=30) == "copy1"
    assert store.round_holder("r") == "copy1"
    assert store.acquire_round("r", "copy2", ttl_s=30, dead_holder="other") == "copy1"
    assert store.acquire_round("r", "copy2", ttl_s=30, dead_holder="copy1") is None
    store.release_round("r", "copy1")  # not its holder any more: nothing happens
    assert store.round_holder("r") == "copy2"
    store.release_round("r", "copy2")
    assert store.round_holder("r") is None
    assert store.acquire_round("short", "a", ttl_s=0.2) is None
    import time

    time.sleep(0.3)
    assert store.acquire_round("short", "b", ttl_s=30) is None  # a dead holder's lease expired
    assert not store.round_is_done("r")
    assert store.acquire_round("r", "copy3", ttl_s=30) is None
    assert not store.finish_round("r", "copy2")  # fenced out: copy3 holds it now
    assert not store.round_is_done("r") and store.round_holder("r") == "copy3"
    assert store.finish_round("r", "copy3")  # the holder: done, and its lease released
    assert store.round_is_done("r") and store.round_holder("r") is None
    assert store.finish_round("free", "anyone")  # no holder (its lease expired): done


def test_starts_that_never_ended_are_counted(store):
    assert store.round_started("p") == 0
    store.round_ended("p")
    assert store.round_started("p") == 0  # the first ended cleanly
    assert store.round_started("p") == 1  # the second did not end (its process died)
    assert store.round_started("p") == 2


def test_copies_of_a_round_that_began_tuning_are_counted(store):
    from farm.store.store import total_counts

    assert store.round_tunings("q") == 0
    assert store.round_tunings("q", add=1) == 0  # the first copy
    assert store.round_tunings("q", add=1) == 1  # a copy after it: the round runs again
    assert store.round_tunings("q") == 2 and store.round_tunings("other") == 0
    store.count_measurements("j", "wk", retries=1)
    store.count_measurements("j", "wk", device_lost=2)
    assert store.job_counts("j")["wk"]["retries"] == 1
    assert "retries" not in total_counts(store.job_counts("j"))  # not a measurement


def test_active_jobs_and_one_supervisor_leads(store):
    store.set_active("j1", True)
    store.set_active("j2", True)
    store.set_active("j1", False)
    assert store.active_jobs() == ["j2"]
    assert store.lead("w1", ttl_s=30)
    assert store.lead("w1", ttl_s=30)
    assert not store.lead("w2", ttl_s=30)


def test_round_holders_reads_each_lease_in_order(store):
    assert store.acquire_round("r1", "a|m|1", 60) is None
    assert store.acquire_round("r3", "c|m|3", 60) is None
    assert store.round_holders(["r1", "r2", "r3"]) == ["a|m|1", None, "c|m|3"]
    assert store.round_holders([]) == []


def test_a_redis_that_does_not_answer_is_the_farms_own_error(tmp_path):
    """Whatever the backend, a store that fails an operation raises the farm's
    StoreUnavailable (a ServiceError: `farm` prints one line and exits 5, a waiting client
    retries), naming the store without its password; the Redis backend's is still a redis-py
    ConnectionError to its own code. Here: a Redis on a loopback port where none listens."""
    import socket

    import redis

    from farm.core.errors import ServiceError
    from farm.store import StoreUnavailable, open_broker, open_store
    from farm.store.sessions import SearchSessions

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nobody listens there
    url = f"redis://:secret@127.0.0.1:{port}/0"
    store = open_store(url)
    for call in (lambda: store.task_states("j1"), lambda: store.records("wk"),
                 lambda: store.best("wk"), lambda: store.spool_size(),
                 lambda: store.acquire_lease("wk", "me", 10), lambda: store.hosts(),
                 lambda: store.phone_stats(), lambda: store.full(),
                 lambda: open_broker(url).depth("tune.k"),
                 lambda: SearchSessions(url).open_now()):
        with pytest.raises(StoreUnavailable) as got:
            call()
        assert isinstance(got.value, ServiceError) and got.value.exit_code == 5
        assert isinstance(got.value, redis.ConnectionError)
        assert "secret" not in str(got.value) and f"127.0.0.1:{port}" in str(got.value)
        assert not isinstance(got.value.__cause__, StoreUnavailable)  # translated once
    store.close()


def test_the_redis_store_hands_every_call_of_its_parts_on_itself():
    """RedisStore's parts (farm/store/redis/) are reached only through its methods, which
    translate their errors: a part's method of the contract RedisStore did not hand on would
    leave the contract's default in its place (round_holders' one read per round, a health
    check that says nothing) or reach no caller."""
    import inspect

    from farm.store.redis.coordination import RedisCoordination
    from farm.store.redis.health import RedisHealth
    from farm.store.redis.hosts import RedisHosts
    from farm.store.redis.jobs import RedisJobs
    from farm.store.redis.phones import RedisPhoneLedger
    from farm.store.redis.records import RedisRecords
    from farm.store.redis.spool import RedisSpool
    from farm.store.redis.store import RedisStore
    from farm.store.store import RecordStore

    contract = {n for n in dir(RecordStore) if not n.startswith("_")
                and callable(getattr(RecordStore, n))}
    parts = (RedisRecords, RedisSpool, RedisJobs, RedisCoordination, RedisHosts,
             RedisPhoneLedger, RedisHealth)
    kept = {n for part in parts for n in vars(part) if n in contract}
    # RedisStore's own methods (translate_errors wraps the inherited ones on it too)
    own = {n for n, f in vars(RedisStore).items() if inspect.isfunction(f)
           and getattr(f, "__wrapped__", f).__qualname__.startswith("RedisStore.")}
    assert kept <= own, f"not handed on by RedisStore: {sorted(kept - own)}"
    assert contract - {"close", "require_job", "holds_name"} <= kept
