"""The model reader runs where the farm's secrets are not: a pickle the user allowed finds
no password in the farm's home, in the secret files, in another process's environment, and
reaches no loopback service (farm/core/confine.py, farm/pipeline/reader.py)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from farm.core import confine
from farm.core.errors import FarmError

SECRET = "s3cret-pw-4711"

PROBE = '''
import json, os, socket
out = {{}}
def attempt(name, f):
    try:
        out[name] = f()
    except Exception as e:
        out[name] = "refused: " + type(e).__name__
def unmounted(path):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(path.encode(), 2) != 0:  # MNT_DETACH
        raise OSError(ctypes.get_errno(), "umount2")
    return "unmounted"
attempt("unmount home", lambda: unmounted({home_dir!r}))
attempt("unmount proc", lambda: unmounted("/proc"))
attempt("home", lambda: open({home!r}).read())
attempt("file", lambda: open({secret_file!r}).read())
attempt("environ", lambda: open("/proc/{pid}/environ", "rb").read().decode(errors="replace"))
attempt("pids", lambda: ",".join(p for p in os.listdir("/proc") if p.isdigit()))
attempt("redis", lambda: str(socket.create_connection(("127.0.0.1", {port}), timeout=3)))
open({report!r}, "w").write(json.dumps(out))
'''


class Probe:
    """Unpickling it runs PROBE: what an allowed pickle could reach."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self):
        return (exec, (self.code, {}))


@pytest.fixture
def secrets(tmp_path: Path, monkeypatch):
    """A farm home with running.json, a secret file, the password in this process's
    environment and a loopback service listening: what a model must not reach."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "running.json").write_text(json.dumps({"redis_password": SECRET}))
    secret_file = tmp_path / "redis-password"
    secret_file.write_text(SECRET)
    secret_file.chmod(0o600)
    monkeypatch.setenv("FARM_REDIS_PASSWORD", SECRET)
    monkeypatch.setenv("FARM_REDIS_PASSWORD_FILE", str(secret_file))
    server = socket.create_server(("127.0.0.1", 0))
    yield home, secret_file, server.getsockname()[1]
    server.close()


def test_an_allowed_pickle_reaches_no_secret_of_the_farm(tmp_path: Path, secrets):
    import torch

    from farm.pipeline.reader import load_apart

    if confine.how().startswith("none"):
        pytest.fail(f"this machine gives no namespaces: {confine.how()}")
    home, secret_file, port = secrets
    report = tmp_path / "report.json"
    code = PROBE.format(home=str(home / "running.json"), home_dir=str(home),
                        secret_file=str(secret_file),
                        pid=os.getpid(), port=port, report=str(report))
    model = tmp_path / "evil.pt"
    torch.save(Probe(code), model)
    with pytest.raises(FarmError, match="not an nn.Module"):  # it ran, and was no model
        load_apart(model, [(1, 4)], "float32", allow_pickle=True, threads=1, hide=[home])
    found = json.loads(report.read_text())
    assert all(SECRET not in str(v) for v in found.values()), found
    for what in ("unmount home", "unmount proc", "home", "environ", "redis"):
        assert str(found[what]).startswith("refused"), (what, found)
    assert found["file"] == "" or found["file"].startswith("refused"), found  # /dev/null
    assert str(os.getpid()) not in found["pids"].split(","), found["pids"]


def test_confined_says_what_it_covers(tmp_path: Path):
    """A folder is covered by an empty one, a file by /dev/null; the child's own folder
    (inside a hidden one) is not covered."""
    import subprocess
    import sys

    hidden = tmp_path / "hidden"
    (hidden / "mine").mkdir(parents=True)
    (hidden / "a").write_text("x")
    argv = confine.confined([sys.executable, "-c", "import os,sys; print(sorted("
                             "os.listdir(sys.argv[1])))", str(hidden)], [hidden],
                            keep=[hidden / "mine"])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "['a', 'mine']", proc.stderr
    argv = confine.confined([sys.executable, "-c", "import sys; print(open(sys.argv[1]).read()"
                             ")", str(hidden / "a")], [hidden], keep=[hidden / "mine"])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "", proc.stdout  # beside the kept folder: covered
    argv = confine.confined([sys.executable, "-c", "import os,sys; print(sorted("
                             "os.listdir(sys.argv[1])))", str(hidden)], [hidden])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "" and "Permission denied" in proc.stderr, proc


def test_the_confined_commands_pid_is_never_a_passing_mount(tmp_path):
    """`inner_pid` names the confined command, not one of the `mount`s the init shell runs
    before it (test_submit_embedded once killed such a PID, gone a moment later, and
    waited for the phone it thought it was). Trees like unshare's: a parent, its init
    shell, the shell's child."""
    import shutil
    import subprocess
    import time

    import psutil

    fake = tmp_path / "mount"  # a process named as _COVER's mounts are
    shutil.copy(shutil.which("sleep"), fake)
    trees = []
    try:
        for child in (f"{fake} 30", "sleep 30"):
            trees.append(subprocess.Popen(["sh", "-c", f"sh -c '{child} & wait' & wait"]))
        deadline = time.monotonic() + 10
        while not all(len(psutil.Process(t.pid).children(recursive=True)) >= 2 for t in trees):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        mounting, running = trees
        assert confine.inner_pid(mounting.pid) == mounting.pid  # no command yet
        command = confine.inner_pid(running.pid)
        assert command != running.pid and psutil.Process(command).name() == "sleep"
    finally:
        for t in trees:
            for p in psutil.Process(t.pid).children(recursive=True):
                p.kill()
            t.kill()
            t.wait()
