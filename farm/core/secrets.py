"""Secrets (the broker URL with its password, Flower's credentials) from the environment
or from a file only their owner can read, never from a command line that `ps` shows.

`FARM_BROKER_URL=...` or `FARM_BROKER_URL_FILE=/etc/tunefarm/broker-url` (mode 0600 or
stricter: a file others can read is refused, with the chmod that fixes it).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from farm.core.errors import UsageError

SECRET_VARS = ("FARM_BROKER_URL", "FARM_REDIS_URL", "FARM_FLOWER_AUTH", "FARM_REDIS_PASSWORD")


def secret(var: str, env: Mapping[str, str] | None = None) -> str | None:
    """The value of `var`, else the content of the file `<var>_FILE` names, else None."""
    env = os.environ if env is None else env
    if env.get(var):
        return env[var]
    path = env.get(f"{var}_FILE")
    if not path:
        return None
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        text = Path(path).read_text().strip()
    except OSError as e:
        raise UsageError(f"cannot read it: {e.strerror or e}", subject=f"{var}_FILE={path}",
                         hint=f"write the secret into {path} (mode 0600)") from e
    if mode & 0o077:
        raise UsageError(f"{path} can be read by other users (mode {mode:04o})",
                         subject=f"{var}_FILE", hint=f"chmod 600 {path}")
    if not text:
        raise UsageError(f"{path} is empty", subject=f"{var}_FILE")
    return text
