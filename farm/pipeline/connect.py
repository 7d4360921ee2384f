"""The farm a job runs on: the lab farm at the configured broker, or an embedded one
started for the job's lifetime."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from farm.core.aliases import CeleryApp
from farm.core.config import FarmConfig
from farm.core.profiles import resolve_profile
from farm.jobs.dispatch import make_app
from farm.local.embedded import embedded_farm
from farm.pipeline.preflight import check_embedded, wait_for_devices
from farm.store import RecordStore, configured_store


@dataclass
class Farm:
    """A connection to a running farm (embedded or lab)."""

    store: RecordStore
    app: CeleryApp
    tracker: str | None
    check_alive: Callable[[], None]
    embedded: bool
    ready: Callable[[], None] = lambda: None  # the embedded farm's phones have registered


@contextlib.contextmanager
def connect(config: FarmConfig, tracker: str | None = None, wait_s: float = 0.0,
            require_devices: bool = True) -> Iterator[Farm]:
    """The farm to submit to: the lab farm at config.broker_url, or an embedded one."""
    if config.broker_url:
        store = configured_store(config)
        store.ping()
        if require_devices:
            wait_for_devices(store, config.device_key, wait_s)
        yield Farm(store=store, app=make_app(config), tracker=tracker,
                   check_alive=lambda: None, embedded=False)
        store.close()
        return

    profile = resolve_profile(config.device_key, config.profiles)
    check_embedded(profile)
    with embedded_farm(config, threads=profile.threads, arch=profile.emulate,
                       wait=False, opencl=profile.target.get("kind") == "opencl") as farm:
        cfg = replace(config, broker_url=farm.broker_url)
        store = configured_store(cfg)
        store.ping()
        try:
            yield Farm(store=store, app=make_app(cfg), tracker=farm.tracker,
                       check_alive=farm.group.check_alive, embedded=True,
                       ready=farm.phones_ready)
        finally:
            store.close()
