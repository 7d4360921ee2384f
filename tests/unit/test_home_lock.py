"""FARM_HOME's lock: a `farm status` that briefly holds it must not make a `farm submit` fail
(CI saw exactly that once the farm started before reading the model); a running farm does."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from farm.core.errors import ServiceError
from farm.local import embedded


def test_a_farm_waits_while_a_status_command_holds_the_home(tmp_path: Path):
    reader = embedded._try_lock(tmp_path, "store")
    assert reader is not None and embedded._try_lock(tmp_path, "farm") is None
    release = threading.Timer(1.0, reader.close)  # closing the file drops its flock
    release.start()
    t0 = time.monotonic()
    lock = embedded._farm_lock(tmp_path)
    assert time.monotonic() - t0 >= 0.5
    assert embedded._holder(tmp_path) == {"pid": os.getpid(), "purpose": "farm"}
    lock.close()


def test_a_second_farm_on_the_same_home_fails_at_once(tmp_path: Path):
    code = ("import sys, time; from pathlib import Path; from farm.local import embedded; "
            "lock = embedded._try_lock(Path(sys.argv[1]), 'farm'); print('held', flush=True); "
            "time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        with pytest.raises(ServiceError, match="another embedded farm is running"):
            embedded._farm_lock(tmp_path)
        assert time.monotonic() - t0 < embedded.LOCK_WAIT_S / 2
    finally:
        holder.kill()
        holder.wait()
    embedded._farm_lock(tmp_path).close()  # the killed holder's lock went with it
