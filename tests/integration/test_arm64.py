"""The cross path on an emulated arm64 phone like a real board: a native RPC server on TVM's
aarch64 runtime library only (farm/devices/native/tvm_rpc.cc; no Python, no compiler) under
qemu user mode, candidates and the model cross-compiled here with aarch64-linux-gnu-g++ (what
an NDK profile does), numerics checked against torch. The phone is made once and kept in
~/.cache between test runs."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import pytest

from farm.core.config import load_config
from farm.devices import arm64sim
from farm.devices.tracker import wait_for_phones
from farm.local import services
from farm.store import open_store
from tests.helpers import run_farm

pytestmark = [pytest.mark.integration, pytest.mark.arm64]

ROOT = Path(os.environ.get("FARM_ARM64_ROOT")
            or Path.home() / ".cache" / "tunefarm-tests" / "arm64-sim")
ENV = {"FARM_ARM64_ROOT": str(ROOT)}


@pytest.fixture(scope="module")
def arm64_tracker(tmp_path_factory):
    missing = arm64sim.missing_tools()
    assert not missing, f"apt-get install {' '.join(missing)} (`make test` does it as root)"
    logs = tmp_path_factory.mktemp("arm64-logs")
    group = services.ServiceGroup()
    try:
        svc, tracker = services.start_tracker(logs)
        group.add(svc)
        config = load_config({}, env={"FARM_HOME": str(logs), **ENV})
        phone = group.add(services.start_phone(tracker, "arm64-sim", 0, logs,
                                               services.PhoneOptions(arch="arm64"), config))
        wait_for_phones(tracker, "arm64-sim", 1, timeout_s=300)
        # the phone is the native server under qemu: no Python, no TVM compiler in it
        cmdline = Path(f"/proc/{phone.pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[0].endswith(b"qemu-aarch64-static") and cmdline[3].endswith(b"/tvm_rpc")
        maps = Path(f"/proc/{phone.pid}/maps").read_text()
        assert "libtvm_runtime.so" in maps and "libtvm_compiler" not in maps and "python" not in maps
        yield tracker
    finally:
        group.stop()


def test_doctor_cross_compiles_and_runs_a_kernel_on_the_arm64_phone(arm64_tracker, tmp_path):
    proc = run_farm(["doctor", "--tracker", arm64_tracker, "--device-key", "arm64-sim"],
                    tmp_path, timeout_s=300, env=ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[pass] compiler of profile arm64-sim: " in proc.stdout
    assert "targets aarch64-linux-gnu" in proc.stdout
    assert "[pass] a candidate on a phone: a candidate built and linked here, uploaded, loaded, run and checked" in proc.stdout


def test_submit_tunes_on_the_emulated_arm64_phone(arm64_tracker, tmp_path):
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(128, 128)

        def forward(self, x):
            return torch.relu(self.fc(x)) * 0.5

    torch.manual_seed(0)
    model = tmp_path / "block.pt2"
    torch.export.save(torch.export.export(Block().eval(), (torch.randn(16, 128),)), model)
    out = tmp_path / "out"
    home = tmp_path / "home"
    proc = run_farm(["submit", str(model), "--device-key", "arm64-sim", "--trials-per-task",
                     "8", "--phones", "1", "--out", str(out)], home, timeout_s=1500, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["device_key"] == "arm64-sim" and summary["numerics_ok"]
    # tuned on the runtime-only phone: faster there than TVM's default schedule
    assert summary["latency_us"]["tuned"] < summary["latency_us"]["untuned"], summary["latency_us"]
    assert "phone of key arm64-sim" in summary["measured_on"]
    assert summary["target"]["mtriple"] == "aarch64-linux-gnu"
    assert all(t["best_us"] is not None for t in summary["tasks"])
    elf = (out / "model.so").read_bytes()[:20]
    assert elf[:4] == b"\x7fELF" and int.from_bytes(elf[18:20], "little") == 183  # EM_AARCH64
    # the records were measured on the emulated phone, for the aarch64 target
    svc, url = services.start_redis(home / "redis", tmp_path / "logs")
    try:
        store = open_store(url)
        for t in summary["tasks"]:
            records = store.records(t["workload_key"])
            assert records and all(r.record[2]["mtriple"] == "aarch64-linux-gnu"
                                   for r in records)
    finally:
        svc.stop()


def test_the_native_phone_survives_a_crashing_kernel(arm64_tracker, tmp_path):
    """A candidate that segfaults ends its session's process, not the native phone: it logs
    the crash and serves the next session (TVM's Python server needed a guard for this)."""
    import tvm
    from tvm.support import cc

    from farm.core.profiles import resolve_profile
    from farm.devices.probe import probe_phone
    from farm.devices.tracker import request_phone
    from tests.helpers import crash_a_session

    profile = resolve_profile("arm64-sim")
    crash_a_session(request_phone(arm64_tracker, "arm64-sim", 60), tmp_path,
                    tvm.target.Target(profile.target_json()),
                    cc.cross_compiler("aarch64-linux-gnu-g++"))
    got = probe_phone(arm64_tracker, profile, timeout_s=120)  # the next session: served
    assert got.run_us > 0


# The native phone's limits (tvm_rpc --handshake-timeout-s, --session-cap-s), short here so
# that the tests below wait seconds; its keepalive's idle time (tvm_rpc.cc: kKeepIdleS).
HANDSHAKE_S, CAP_S, KEEPIDLE_S = 3, 8, 30
LIMITS = ["--handshake-timeout-s", str(HANDSHAKE_S), "--session-cap-s", str(CAP_S)]
GUARDED = "arm64-guard"


@pytest.fixture(scope="module")
def guarded_phone(arm64_tracker, tmp_path_factory):
    """A second native phone on the same tracker, with short limits and a work folder of its
    own: (tracker, its port, its work folder, its Service)."""
    work = tmp_path_factory.mktemp("guarded-work")
    binary = arm64sim.prepare(ROOT)
    port = services.free_port()
    phone = services.start("phone-guarded", [
        *arm64sim.phone_argv(binary), "--tracker", arm64_tracker, "--key", GUARDED,
        "--host", "127.0.0.1", "--port", str(port), "--port-end", str(port + 1),
        "--work-dir", str(work), *LIMITS], tmp_path_factory.mktemp("guarded-logs"),
        arm64sim.phone_env(1), inherit=False)
    try:
        wait_for_phones(arm64_tracker, GUARDED, 1, timeout_s=120)
        yield arm64_tracker, port, work, phone
    finally:
        phone.stop()


def _session(tracker: str, session_timeout_s: int = 60):
    """A session on the guarded phone, asking for `session_timeout_s` (0: no limit)."""
    from tvm.rpc import client

    from farm.devices.tracker import grant

    url, port, matchkey = grant(tracker, GUARDED)
    return client.connect(url, port, matchkey, session_timeout_s)


def test_a_silent_connection_does_not_hold_the_native_phone(guarded_phone):
    """A client that connects and sends nothing is dropped after the handshake timeout; the
    next client gets its session (before: the phone waited on it for good, for everybody)."""
    import socket
    from concurrent.futures import ThreadPoolExecutor

    tracker, port, _, _ = guarded_phone
    silent = socket.create_connection(("127.0.0.1", port))
    pool = ThreadPoolExecutor(1)
    try:
        start = time.monotonic()
        future = pool.submit(lambda: _session(tracker).get_function(
            "tvm.rpc.server.workpath")("a.so"))
        assert future.result(timeout=HANDSHAKE_S + 30).endswith("/a.so")
        assert time.monotonic() - start >= HANDSHAKE_S - 0.5  # it did wait for the silent one
        silent.settimeout(5)
        assert silent.recv(1) == b""  # the phone closed the silent connection
    finally:
        silent.close()  # before: frees the phone, so that the session's thread ends
        pool.shutdown(wait=True)


def _tcp_sockets() -> list[dict[str, int]]:
    """This machine's IPv4 TCP sockets (/proc/net/tcp): ports, state, timer and inode."""
    rows = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        timer, when = f[5].split(":")
        rows.append({"lport": int(f[1].split(":")[1], 16), "rport": int(f[2].split(":")[1], 16),
                     "state": int(f[3], 16), "timer": int(timer, 16),
                     "when_s": int(when, 16) // os.sysconf("SC_CLK_TCK"), "inode": int(f[9])})
    return rows


def _inodes(pid: int) -> set[int]:
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                found.add(int(target[8:-1]))
    return found


def test_the_native_phone_keeps_its_connections_alive(guarded_phone):
    """Its tracker link and a session's connection have TCP keepalive, with an idle time of
    seconds, not the kernel's two hours: a peer that vanished is noticed (before: none)."""
    tracker, port, _, phone = guarded_phone
    tracker_port = int(tracker.rsplit(":", 1)[1])
    remote = _session(tracker)
    assert remote.get_function("tvm.rpc.server.workpath")("a.so").endswith("/a.so")
    mine = _inodes(phone.popen.pid)
    deadline = time.monotonic() + 10
    while True:  # timer 2: the keepalive timer, shown once a link is idle (1: data in flight)
        links = [s for s in _tcp_sockets() if s["inode"] in mine and s["state"] == 1
                 and (s["rport"] == tracker_port or s["lport"] == port)]
        if all(s["timer"] == 2 for s in links) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert {s["rport"] == tracker_port for s in links} == {True, False}, links
    assert all(s["timer"] == 2 and s["when_s"] <= KEEPIDLE_S for s in links), links
    del remote


def test_the_native_phone_refuses_names_outside_its_work_folder(guarded_phone, tmp_path):
    """upload, download, remove, workpath and load_module take plain names in the session's
    folder; `..` and absolute names are refused with an error that says so (before: a client
    read, wrote and removed files anywhere the phone's user could)."""
    from tvm.error import RPCError

    _, _, work, _ = guarded_phone
    refused = "tvm_rpc refused the file name"
    secret = work / "secret.txt"  # beside the session folders: "../secret.txt" from one
    secret.write_text("not yours")
    remote = _session(guarded_phone[0])
    remote.upload(bytearray(b"mine"), "ok.bin")  # a plain name: as before
    assert bytes(remote.download("ok.bin")) == b"mine"
    workpath = remote.get_function("tvm.rpc.server.workpath")
    folder = Path(workpath(""))  # "": the session's folder (MetaSchedule's clean-up removes it)
    assert folder.parent == work and folder.name.startswith("tvm_rpc-")
    for name in ("../escape.bin", str(tmp_path / "abs.bin"), "..", "sub/../../x.bin"):
        with pytest.raises(RPCError, match=refused):
            remote.upload(bytearray(b"evil"), name)
        with pytest.raises(RPCError, match=refused):
            workpath(name)
    assert not (work / "escape.bin").exists() and not (tmp_path / "abs.bin").exists()
    for name in ("../secret.txt", str(secret)):
        with pytest.raises(RPCError, match=refused):
            remote.download(name)
        with pytest.raises(RPCError, match=refused):
            remote.remove(name)
        with pytest.raises(RPCError, match=refused):
            remote.load_module(name)
    assert secret.read_text() == "not yours"


def test_the_native_phone_ends_a_session_past_its_cap(guarded_phone):
    """A session that asked for no time limit is closed at the phone's cap, and the phone
    serves the next session (before: it lasted as long as its client liked). The client
    reads the phone's RPCSessionTimeoutError, or (when the cap falls while a call's reply is
    on its way) TVM's error of a stream cut short: the phone's log names the cap either way."""
    from tvm.error import InternalError, RPCError

    tracker, _, _, phone = guarded_phone
    remote = _session(tracker, session_timeout_s=0)
    workpath = remote.get_function("tvm.rpc.server.workpath")
    start = time.monotonic()
    ended = None
    while time.monotonic() - start < CAP_S + 20:
        try:
            workpath("a.so")
        except (RPCError, InternalError) as e:
            assert isinstance(e, InternalError) or "the phone's cap" in str(e), e
            ended = time.monotonic() - start
            break
        time.sleep(0.5)
    assert ended is not None and CAP_S - 1 <= ended <= CAP_S + 20, ended
    assert f"session cap of {CAP_S} s" in phone.log_path.read_text()
    assert _session(tracker).get_function("tvm.rpc.server.workpath")("b.so").endswith("/b.so")
