"""What the `farm` commands share: the config from flags, and the farm's store."""

# Imports inside functions: the CLI loads a command's modules when it runs (a command
# that opens no embedded farm loads none of it).

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from farm.core.config import FarmConfig
    from farm.store import RecordStore


def config_of(args: argparse.Namespace, **flags: object) -> FarmConfig:
    from farm.core.config import load_config

    return load_config(flags, config_file=getattr(args, "config", None))


@contextlib.contextmanager
def store_of(args: argparse.Namespace) -> Iterator[RecordStore]:
    """The lab farm's store, or the embedded farm's (its Redis started for this command)."""
    from farm.local.embedded import farm_store

    with farm_store(config_of(args, broker_url=getattr(args, "broker", None))) as store:
        yield store


def say(line: str) -> None:
    """A job's progress line, on stderr (stdout keeps what a script reads)."""
    print(line, file=sys.stderr, flush=True)
