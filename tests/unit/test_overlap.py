"""Which phones share the worker host's cores (then rounds must not overlap their measurements)."""

from __future__ import annotations

import socket

from farm.core.config import load_config
from farm.devices.tracker import KeyInfo, phones_on_this_host, this_host_addresses


def test_phones_on_loopback_or_this_hosts_addresses_share_its_cores():
    mine = sorted(a for a in this_host_addresses() if not a.startswith("127."))
    found = {"emu": KeyInfo(2, 2, 0, hosts=("127.0.0.1",)),
             "lan": KeyInfo(1, 1, 0, hosts=(mine[0],)),
             "phones": KeyInfo(3, 3, 0, hosts=("192.0.2.10", "192.0.2.11")),  # TEST-NET-1
             "mixed": KeyInfo(2, 2, 0, hosts=("192.0.2.10", "127.0.0.1"))}
    assert phones_on_this_host(found, ["emu"])
    assert phones_on_this_host(found, ["lan"])
    assert not phones_on_this_host(found, ["phones"])
    assert phones_on_this_host(found, ["phones", "mixed"])
    assert socket.gethostname() in this_host_addresses()


def test_concurrency_is_automatic_by_default_and_search_threads_follow_it():
    cfg = load_config(env={})
    assert cfg.worker_concurrency == 0 and cfg.search_threads >= 1
    two = load_config(env={"FARM_WORKER_CONCURRENCY": "2", "FARM_SEARCH_CORES": "0"})
    import os

    assert two.search_threads == max(1, (os.cpu_count() or 1) // 2)
    assert load_config(env={"FARM_SEARCH_CORES": "3"}).search_threads == 3
