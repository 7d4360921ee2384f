"""A commit whose reply is lost is sent again by redis-py's retry: the store must answer it
as the first time and count the measurement once (farm/store/redis/keep_best.lua's attempt id).
Reproduced with a real Redis behind a loopback proxy that drops the connection after the
commit reached Redis and before its reply reached the client."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest

from farm.core import keys
from farm.store import StoredRecord, open_store


class ReplyDropper:
    """A TCP proxy on 127.0.0.1 to a Redis: the first time a client's request holds
    `trigger`, the request reaches Redis, Redis's reply is read and thrown away and the
    client's connection is closed (a reply lost to a dropped link or a failover)."""

    def __init__(self, upstream: tuple[str, int], trigger: bytes) -> None:
        self.upstream, self.trigger = upstream, trigger
        self.flush_scripts = False  # as a failover's new primary: no script loaded
        self.dropped = 0
        self.armed = False  # `arm()`: from then on, the first request with the trigger
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(client,), daemon=True)
            t.start()
            self.threads.append(t)

    def _serve(self, client: socket.socket) -> None:
        """Two pumps; once the client's request held the trigger, the next bytes Redis sends
        back (the commit's reply) are thrown away and both connections closed."""
        redis = socket.create_connection(self.upstream)
        doomed = threading.Event()

        def replies() -> None:
            with contextlib.suppress(OSError):
                while data := redis.recv(1 << 16):
                    if doomed.is_set():
                        if self.flush_scripts:
                            with socket.create_connection(self.upstream) as admin:
                                admin.sendall(b"SCRIPT FLUSH\r\n")
                                admin.recv(64)
                        break  # the commit ran; its reply is lost with the connection
                    client.sendall(data)
            for s in (client, redis):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

        threading.Thread(target=replies, daemon=True).start()
        with client, redis, contextlib.suppress(OSError):
            while data := client.recv(1 << 16):
                with self.lock:
                    if self.armed and self.trigger in data and self.dropped == 0:
                        self.dropped = 1
                        doomed.set()
                redis.sendall(data)

    def arm(self) -> None:
        with self.lock:
            self.armed = True

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def dropper(clean_redis: str) -> Iterator[tuple[ReplyDropper, str, str]]:
    """The proxy, the store's URL through it, and the URL straight to the Redis."""
    url = urlparse(clean_redis)
    proxy = ReplyDropper((url.hostname or "127.0.0.1", url.port or 6379), b"EVALSHA")
    try:
        yield proxy, clean_redis.replace(f":{url.port}", f":{proxy.port}", 1), clean_redis
    finally:
        proxy.close()


@pytest.mark.parametrize("failover", [False, True])
def test_a_commit_sent_again_after_its_reply_was_lost_counts_once(dropper, failover):
    """`failover`: the commit is sent again to a Redis that has no script loaded (a new
    primary), which answers NOSCRIPT: loaded and sent once more, still counted once."""
    proxy, url, direct_url = dropper
    proxy.flush_scripts = failover
    store = open_store(url)
    first = StoredRecord(workload_key="wk", candidate="c0", record=[[[], []], [3e-6], {}, []],
                         run_us=3.0, job_id="job", host="h")
    assert store.add_record(first) is True  # Redis has the script: the next commit runs it
    proxy.arm()
    rec = StoredRecord(workload_key="wk", candidate="c1", record=[[[], []], [2e-6], {}, []],
                       run_us=2.0, job_id="job", host="h")
    assert store.add_record(rec) is True  # new: the retried commit says what the first did
    assert proxy.dropped == 1  # the reply of the first commit was lost
    direct = open_store(direct_url)
    measured = direct.r.hgetall(keys.job_counts("job"))
    assert measured.get("wk|measurements") == "2", measured
    assert measured.get("wk|duplicates") is None, measured
    assert direct.best("wk").candidate == "c1"
    store.close()
    direct.close()


def test_a_second_measurement_of_a_candidate_is_still_a_duplicate(clean_redis):
    """The attempt id is per commit: a real second measurement counts as a duplicate."""
    store = open_store(clean_redis)
    rec = StoredRecord(workload_key="wk", candidate="c1", record=[[[], []], [2e-6], {}, []],
                       run_us=2.0, job_id="job", host="h")
    assert store.add_record(rec) is True
    assert store.add_record(rec) is False
    counts = store.r.hgetall(keys.job_counts("job"))
    assert counts["wk|measurements"] == "2" and counts["wk|duplicates"] == "1"
    store.close()
