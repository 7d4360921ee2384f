"""A child process that cannot reach the farm's secrets, though it runs as this user.

Untrusted input runs in children: the model reader (a TorchScript program, a pickle the user
allowed) and the emulated phones (anyone who reaches a phone runs code in it). An empty
environment is not enough: a process of the same user reads `/proc/<pid>/environ` of the
farm's other processes, the embedded farm's `running.json` (its Redis password) and the
files `FARM_*_FILE` name. `confined` runs a command in Linux namespaces of its own
(util-linux `unshare`; a user namespace too when not root):
- a PID namespace with its own /proc: no other process of the machine is visible;
- a mount namespace where the farm's home, its runtime folder and every secret file are
  covered (a folder by an empty tmpfs, a file by /dev/null);
- with `network=False`, a network namespace of its own: nothing to connect to, loopback
  Redis and trackers included.
Where the machine gives no namespaces (no `unshare`, or user namespaces disabled for users),
the command runs as it is, and `how()` says so (docs/security.md says what it can reach).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from farm.core.secrets import SECRET_VARS, runtime_dir

log = logging.getLogger(__name__)

# Covers each path given ($2.. up to $1 of them), then runs the rest of the arguments as its
# child with no capability at all (setpriv: it cannot unmount what covers the secrets, nor
# mount anything, nor gain a capability back through a setuid program). The shell is the
# PID namespace's init, which gets only the signals it has a handler for, so it traps them
# and passes them on (a SIGTERM to a confined phone ends it), and ends with the command's
# status. The command reads the shell's standard input (fd 3).
_COVER = ('set -e; n=$1; shift; while [ "$n" -gt 0 ]; do p=$1; shift; n=$((n-1)); '
          'if [ -d "$p" ]; then mount -t tmpfs -o size=64k,mode=000 none "$p"; '
          'else mount --bind /dev/null "$p"; fi; done; set +e; exec 3<&0; '
          'setpriv --bounding-set=-all --inh-caps=-all --no-new-privs -- "$@" <&3 3<&- & '
          'c=$!; exec 3<&-; '
          "trap 'kill -s TERM $c 2>/dev/null' TERM INT HUP; "
          'while :; do wait $c; s=$?; kill -0 $c 2>/dev/null || exit $s; done')


@dataclass(frozen=True)
class Confinement:
    """What a confined service must not see (`hide`), and what it needs inside it (`keep`)."""

    hide: tuple[Path, ...]
    keep: tuple[Path, ...] = ()


def _flags(network: bool) -> list[str]:
    flags = ["--mount", "--pid", "--fork", "--kill-child", "--mount-proc"]
    if not network:
        flags.append("--net")
    if os.geteuid() != 0:
        flags[:0] = ["--user", "--map-root-user"]
    return flags


@functools.cache
def _works(network: bool) -> str | None:
    """None when `unshare` gives this user the namespaces here, else why not."""
    unshare = shutil.which("unshare")
    if unshare is None or shutil.which("setpriv") is None:
        return "util-linux's unshare and setpriv are not installed"
    try:
        proc = subprocess.run([unshare, *_flags(network), "sh", "-c", _COVER, "sh", "0",
                               "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare failed: {e}"
    if proc.returncode != 0:
        return f"unshare failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
    return None


def secret_paths(env: Mapping[str, str] | None = None) -> list[Path]:
    """The files the farm's `<VAR>_FILE` variables name (`env`: this process's)."""
    env = os.environ if env is None else env
    return [Path(env[f"{v}_FILE"]) for v in SECRET_VARS if env.get(f"{v}_FILE")]


def confined(argv: list[str], hide: Iterable[Path], network: bool = False,
             keep: Iterable[Path] = ()) -> list[str]:
    """`argv` to run in namespaces of its own with `hide` (and the secret files, and the
    farm's runtime folder) covered, but none that holds a path of `keep` (the child's own
    folder); `argv` itself where the machine cannot (logged once)."""
    why = _works(network)
    if why is not None:
        _warn(why)
        return list(argv)

    covered = [*hide, *secret_paths(), Path(runtime_dir(""))]
    paths = sorted(_cover(covered, [k.resolve() for k in keep]))
    return [str(shutil.which("unshare")), *_flags(network), "sh", "-c", _COVER, "sh",
            str(len(paths)), *paths, *argv]


def _cover(paths: Iterable[Path], kept: list[Path]) -> set[str]:
    """The paths to cover: each of `paths` that exists, except that a folder holding a kept
    path is not covered whole: its other entries are, one by one."""
    out: set[str] = set()
    for path in (p.resolve() for p in paths if p.exists()):
        if any(k == path for k in kept):
            continue
        if any(path in k.parents for k in kept):
            out |= _cover(path.iterdir(), kept)
        else:
            out.add(str(path))
    return out


def inner_pid(pid: int) -> int:
    """The confined command `unshare` (at `pid`) runs (the child of its init shell), as this
    machine's PID; `pid` itself while it has none (the shell still mounting its covers: a
    `mount` then is no service's PID, and it is gone a moment later)."""
    import psutil

    with contextlib.suppress(psutil.Error):
        for init in psutil.Process(pid).children():
            for command in init.children():
                if command.name() != "mount":  # _COVER's mounts come and go before it
                    return int(command.pid)
    return pid


def how(network: bool = False) -> str:
    """What `confined` gives on this machine, in a few words (for `farm doctor`, logs)."""
    why = _works(network)
    return "namespaces (PID, mount" + ("" if network else ", network") + ")" if why is None \
        else f"none: {why}"


@functools.cache
def _warn(why: str) -> None:
    log.warning("untrusted children (the model reader, emulated phones) run without "
                "namespaces (%s): they can read what this user can (docs/security.md)", why)
