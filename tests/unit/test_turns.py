"""workers/metaschedule/turns.py: a batch waits for older batches of its key on the host, but not for one
whose process is gone or that hangs (the integration test with a real tracker and phones is
in tests/integration/test_phones.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from workers.metaschedule.turns import Turns, settle


def older_ticket(root: str, pid: int, left: int, age_s: float = 0.0) -> str:
    turns = Turns("127.0.0.1:9190", "k", stale_s=5, root=root)
    os.makedirs(turns.dir, exist_ok=True)
    path = os.path.join(turns.dir, f"{time.time_ns() - 10**9:020d}-{pid}")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{left:010d}")
    if age_s:
        os.utime(path, (time.time() - age_s, time.time() - age_s))
    return path


def test_a_batch_waits_while_an_older_one_has_measurements_without_a_phone(tmp_path):
    root = str(tmp_path)
    path = older_ticket(root, os.getpid(), left=2)
    turns = Turns("127.0.0.1:9190", "k", stale_s=5, root=root)
    mine = turns.start(3)
    done = threading.Event()
    waited: list[float] = []
    t = threading.Thread(target=lambda: (waited.append(turns.wait()), done.set()))
    t.start()
    settle(path)
    assert not done.wait(0.5)  # the older batch still has 1 without a phone
    settle(path)  # its last one was granted one
    assert done.wait(5)
    t.join()
    assert waited[0] >= 0.5
    assert turns.wait() < 0.1 and turns.wait() < 0.1  # its other two go at once
    for _ in range(3):
        settle(mine)
    with open(mine, encoding="utf-8") as f:
        assert int(f.read()) == 0
    turns.returned(mine)
    turns.returned(mine)
    assert os.path.exists(mine)
    turns.returned(mine)  # all its calls are over: its ticket is gone
    assert sorted(os.listdir(turns.dir)) == [os.path.basename(path)]


def test_measurements_asked_from_many_processes_are_all_counted(tmp_path):
    """Each of 40 grants, from 4 processes at once, takes exactly one off the count."""
    turns = Turns("127.0.0.1:9190", "k", stale_s=5, root=str(tmp_path))
    ticket = turns.start(50)
    code = ("import sys\nfrom workers.metaschedule.turns import settle\n"
            "for _ in range(10): settle(sys.argv[1])")
    procs = [subprocess.Popen([sys.executable, "-c", code, ticket]) for _ in range(4)]
    assert [p.wait(timeout=60) for p in procs] == [0] * 4
    with open(ticket, encoding="utf-8") as f:
        assert int(f.read()) == 10


def test_a_batch_whose_calls_all_returned_holds_no_one_even_unsettled(tmp_path):
    """A call killed at its deadline before the tracker granted it a phone never settles; once
    the batch's calls have all returned, it no longer holds a younger batch."""
    older = Turns("127.0.0.1:9190", "k", stale_s=60, root=str(tmp_path))
    ticket = older.start(2)
    younger = Turns("127.0.0.1:9190", "k", stale_s=60, root=str(tmp_path))
    time.sleep(0.01)
    younger.start(1)
    settle(ticket)  # one granted; the other's process was killed while it asked
    older.returned(ticket)
    waited: list[float] = []
    t = threading.Thread(target=lambda: waited.append(younger.wait()))
    t.start()
    time.sleep(0.3)
    assert not waited  # still held: one call of the older batch is out
    older.returned(ticket)
    t.join(5)
    assert waited and waited[0] >= 0.3


def test_an_older_batch_has_the_higher_tracker_priority(tmp_path):
    first = Turns("t", "k", stale_s=5, root=str(tmp_path))
    first.start(1)
    time.sleep(0.01)
    second = Turns("t", "k", stale_s=5, root=str(tmp_path))
    second.start(1)
    assert first.priority > second.priority


def test_a_dead_or_hanging_older_batch_holds_no_one(tmp_path):
    root = str(tmp_path)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = older_ticket(root, int(gone.stdout), left=5)
    older_ticket(root, os.getpid(), left=5, age_s=60)  # alive, but has not moved for 60 s
    turns = Turns("127.0.0.1:9190", "k", stale_s=5, root=root)
    turns.start(1)
    assert turns.wait() < 0.5
    assert not os.path.exists(dead)  # the dead process's ticket was removed


def test_no_queue_directory_means_unordered_not_failed(tmp_path):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")  # the queue's directory cannot be made under a file
    turns = Turns("127.0.0.1:9190", "k", stale_s=5, root=str(blocked))
    turns.start(2)
    assert turns.wait() < 0.1 and turns.priority == 1


def test_a_measurement_of_an_abandoned_batch_does_not_count_for_the_next(tmp_path):
    turns = Turns("127.0.0.1:9190", "k", stale_s=5, root=str(tmp_path))
    first = turns.start(2)
    second = turns.start(3)  # the round gave up the first batch and measures another
    assert not os.path.exists(first)  # the first holds no one any more
    assert turns.wait(first) < 0.1  # a late measurement of the first batch
    settle(first)
    turns.returned(first)
    with open(second, encoding="utf-8") as f:
        assert int(f.read()) == 3  # the second batch still has its three to be granted
    settle(second)
    turns.returned(second)
    with open(second, encoding="utf-8") as f:
        assert int(f.read()) == 2


def test_the_runtime_folder_is_this_users_and_private(tmp_path, monkeypatch):
    """The phones' shared files live in a folder only this user reads (it was one fixed
    folder in /tmp for every user of the machine); one planted by another user is refused."""
    import os
    import stat

    import pytest

    from farm.core.errors import UsageError
    from farm.core.secrets import runtime_dir

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    path = runtime_dir("phone-ends")
    assert path == str(tmp_path / "tunefarm" / "phone-ends")
    assert stat.S_IMODE(os.stat(tmp_path / "tunefarm").st_mode) == 0o700
    planted = tmp_path / "other"
    planted.mkdir()
    (planted / "tunefarm").symlink_to("/")  # not a folder of this user's (a link to /)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(planted))
    with pytest.raises(UsageError, match="not a folder of this user"):
        runtime_dir("phone-ends")
