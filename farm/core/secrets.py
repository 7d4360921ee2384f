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

SECRET_VARS = ("FARM_BROKER_URL", "FARM_REDIS_URL", "FARM_FLOWER_AUTH", "FARM_REDIS_PASSWORD",
               "FLOWER_BASIC_AUTH")


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


def runtime_dir(name: str) -> str:
    """A folder of this user's only, for what the farm's processes of one machine share
    (a phone's last measurement, the phones' queue): `$XDG_RUNTIME_DIR/tunefarm/<name>`, else
    `<temp>/tunefarm-<uid>/<name>`, made 0700. A `tunefarm-<uid>` another user made first
    (to read or plant files) is refused, not used."""
    import tempfile

    base = os.environ.get("XDG_RUNTIME_DIR")
    root = Path(base) / "tunefarm" if base else Path(tempfile.gettempdir()) / f"tunefarm-{os.getuid()}"
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise UsageError("is not a folder of this user's: another user made it first",
                         subject=str(root), hint="remove it, or set XDG_RUNTIME_DIR")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(root, 0o700)
    path = root / name
    path.mkdir(exist_ok=True, mode=0o700)
    return str(path)


def flower_auth(env: Mapping[str, str] | None = None) -> str | None:
    """Flower's basic auth (user:password): $FARM_FLOWER_AUTH (or its _FILE), else Flower's own
    $FLOWER_BASIC_AUTH, as a Flower user sets it; None: neither."""
    env = os.environ if env is None else env
    return secret("FARM_FLOWER_AUTH", env) or env.get("FLOWER_BASIC_AUTH") or None
