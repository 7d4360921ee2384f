"""Every check that bad input can fail, before a service starts or a byte is written."""

from __future__ import annotations

import math
import os
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from farm.core.config import FarmConfig
from farm.core.errors import ServiceError, UsageError, last_line
from farm.core.messages import PRIORITIES
from farm.core.profiles import DeviceProfile, canonical_target, known_keys, resolve_profile
from farm.devices import opencl, tracker
from farm.pipeline import ingest as ingest_stage
from farm.pipeline.modelfile import check_model
from farm.pipeline.options import SubmitOptions
from farm.store import configured_store
from farm.store.hosts import HostRegistry
from farm.store.jobs import JobReader


def check_options(opts: SubmitOptions) -> None:
    """The job's numbers: whole trials, finite seconds, each in range."""
    for flag, value, least, example in (
            ("--trials-per-task", opts.trials_per_task, 1, "e.g. --trials-per-task 32"),
            ("--trials", opts.trials_budget, 0, "e.g. --trials 500, or leave it out"),
            ("--early-stop", opts.early_stop_rounds, 0, "e.g. --early-stop 3, or leave it out")):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise UsageError(f"must be a whole number >= {least}, got {value!r}", subject=flag,
                             hint=example)
    for flag, secs, positive in (("--timeout", opts.timeout_s, True),
                                 ("--wait-for-devices", opts.wait_for_devices_s, False)):
        if secs is not None and (not math.isfinite(secs) or secs < 0 or positive and secs == 0):
            raise UsageError(f"must be a finite number of seconds {'> 0' if positive else '>= 0'}"
                             f", got {secs!r}", subject=flag,
                             hint=f"e.g. {flag} 3600, or leave it out")
    if opts.priority not in PRIORITIES:
        raise UsageError(f"--priority must be one of {', '.join(PRIORITIES)}, "
                         f"got {opts.priority!r}")


OUT_MARKER = ".tunefarm-result"  # in every --out the farm wrote (job.complete)


def is_result(out: Path) -> bool:
    """`out` is missing, empty, or a results folder the farm wrote (its marker)."""
    return not out.exists() or (out.is_dir() and (not any(out.iterdir())
                                                  or (out / OUT_MARKER).is_file()))


def check_out_dir(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise UsageError("--out exists and is not a folder", subject=str(out))
    if out.exists() and any(out.iterdir()) and not force:
        raise UsageError("--out exists and is not empty", subject=str(out),
                         hint="choose another --out or pass --force to replace it")


def check_out_writable(out: Path, keep: list[Path]) -> None:
    """The results are staged beside --out and moved in at the end (`complete`): the folder
    that will hold --out, or the nearest one that exists (the rest is made then), must be a
    folder this process can write in, and --out (replaced at the end) must hold none of
    `keep` (the model, FARM_HOME). Checked now, not after hours of tuning."""
    target = out.resolve()
    for path in keep:
        if path.resolve() == target or target in path.resolve().parents:
            raise UsageError(f"--out would replace {path}", subject=str(out),
                             hint="choose a results folder of its own")
    parent = target.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"--out cannot be made: {parent} is a file, not a folder",
                         subject=str(out), hint="choose an --out under a folder")
    try:  # a real attempt: permission bits do not tell root, read-only mounts or /proc
        os.rmdir(tempfile.mkdtemp(prefix=f".{target.name or 'out'}.probe-", dir=parent))
    except OSError as e:
        raise UsageError(f"--out cannot be written: {parent}: {e.strerror or e}",
                         subject=str(out), hint="choose an --out in a folder you can write") from e


def check_tracker(addr: str, device_key: str, wait_s: float) -> None:
    """--tracker (where the compiled model runs, on a phone of the key) is HOST:PORT, a TVM RPC
    tracker answers there, and (unless waiting for devices) it has a phone of the key: found
    now, not at the compile step after the whole tuning."""

    tracker.parse_addr(addr)  # a UsageError when it is no HOST:PORT

    before = socket.getdefaulttimeout()
    socket.setdefaulttimeout(10.0)  # TVM's tracker client waits forever on a silent peer
    try:
        found = tracker.phones(addr)  # a ServiceError naming the tracker when none answers
    finally:
        socket.setdefaulttimeout(before)
    have = found.get(device_key)
    if wait_s == 0 and (have is None or have.total == 0):
        raise ServiceError(f"no phone of key {device_key!r} is registered at this tracker "
                           f"(keys there: {', '.join(sorted(found)) or 'none'})",
                           subject=f"tracker {addr}",
                           hint="the compiled model runs on a phone of the key there: pass the "
                                "tracker of a worker host with such phones, or "
                                "--wait-for-devices SECONDS")


def preflight(opts: SubmitOptions, config: FarmConfig,
              say: Callable[[str], None]) -> None:
    """Every check bad input can fail, before a service starts or a byte is written: the
    flags, the model file (never unpickled here), --out, the device key, --tracker, and a lab
    farm's store and phones. Cheap checks first; TVM is imported only for a --tracker."""
    check_options(opts)
    shapes = ingest_stage.parse_shapes(opts.input_shape)
    ingest_stage.check_inputs(shapes, opts.dtype)
    check_out_dir(opts.out, opts.force)
    check_out_writable(opts.out, [opts.model, Path(config.home)])
    check_model(opts.model, shapes, opts.allow_pickle)
    lab = bool(config.broker_url)
    # the embedded farm emulates phones of any key it is told, so a mistyped key would tune
    # for this CPU: refused. A lab farm's hosts say which keys exist (checked below).
    profile = resolve_profile(config.device_key, config.profiles, strict=not lab)
    check_target(profile)
    if not lab:
        check_embedded(profile)
        if not opts.wait:
            raise UsageError("--no-wait needs a farm that goes on without this command; the "
                             "embedded farm stops with it", subject="--no-wait",
                             hint="set FARM_BROKER_URL to a lab farm (`farm up` starts one), "
                                  "or drop --no-wait")
        if opts.tracker:
            raise UsageError("--tracker is for a lab farm; the embedded farm runs the compiled "
                             "model on its own emulated phones", subject=f"tracker {opts.tracker}",
                             hint="drop --tracker, or set FARM_BROKER_URL")
        return
    if opts.tracker:
        check_tracker(opts.tracker, profile.key, opts.wait_for_devices_s)
    else:
        check_runs_here(profile)
    store = configured_store(config)
    try:
        store.ping()
        if opts.wait_for_devices_s == 0:
            wait_for_devices(store, profile.key, 0)
        check_name_free(store, opts.name)  # claimed for good when the job is dispatched
    finally:
        store.close()
    if profile.key not in known_keys(config.profiles):
        say(f"device key {profile.key} has no profile here: tuning for target "
               f"{canonical_target(profile.target)} (describe the device in farm.toml as "
               f"[profiles.{profile.key}] if that is not what it is)")


def check_target(profile: DeviceProfile) -> None:
    """The profile's target is one TVM accepts (an attribute of the wrong type, an unknown
    kind), before the model is read: not an error from deep in TVM after it loads."""
    import tvm

    try:
        tvm.target.Target(profile.target_json())
    except Exception as e:  # noqa: BLE001 - TVM's ValueError/TVMError: its last line says it
        raise UsageError(f"TVM refuses its target {canonical_target(profile.target)}: "
                         f"{last_line(e)}", subject=f"profile {profile.key}",
                         hint=f"fix target in [profiles.{profile.key}] of farm.toml") from e


def check_embedded(profile: DeviceProfile) -> None:
    """Refuse, with the reason, a profile the embedded farm's emulated phones cannot run: they
    are this machine's CPU (or an arm64 one under qemu), and with an OpenCL profile this
    machine's OpenCL device (pocl's CPU device where there is no GPU)."""
    import platform

    kind = profile.target.get("kind")
    if kind not in ("llvm", "opencl"):
        raise UsageError(f"the embedded farm's phones are CPUs or OpenCL devices; profile "
                         f"{profile.key} targets {kind}", subject=f"device key {profile.key}",
                         hint="submit to a lab farm whose phones run a TVM RPC app built with "
                              "it (FARM_BROKER_URL)")
    host = profile.target if kind == "llvm" else profile.target.get("host") or {}
    triple = str(host.get("mtriple", "")) if isinstance(host, dict) else ""
    emulated = {"arm64": "aarch64"}.get(profile.emulate, platform.machine())
    if triple and not triple.startswith(emulated):
        raise UsageError(f"the embedded farm emulates phones of this {emulated} CPU, "
                         f"but profile {profile.key} targets {triple}",
                         subject=f"device key {profile.key}",
                         hint="submit to a lab farm with phones of that key (FARM_BROKER_URL), "
                              "or use --device-key arm64-sim for an emulated arm64 phone" +
                              (", or opencl-local for this machine's OpenCL device"
                               if kind == "opencl" else ""))
    if kind == "opencl":
        if profile.emulate:
            raise UsageError("the embedded farm's OpenCL phones run on this machine, not under "
                             "qemu", subject=f"device key {profile.key}",
                             hint="drop emulate from the profile")
        missing = opencl.missing_packages()
        if missing:
            raise UsageError(f"the embedded farm's OpenCL phones need {', '.join(missing)}",
                             subject=f"device key {profile.key}",
                             hint=f"apt-get install {' '.join(missing)} (or `make system-deps` "
                                  "as root)")
        opencl.source_tree()  # where TVM's OpenCL runtime is built from, or why there is none


def check_runs_here(profile: DeviceProfile) -> None:
    """A lab job without --tracker times its tuned model on this machine's CPU: refuse a
    profile whose code cannot run here (a GPU, another architecture) before it tunes."""
    import platform

    kind = profile.target.get("kind")
    triple = str(profile.target.get("mtriple", "")) if kind == "llvm" else ""
    if kind != "llvm" or (triple and not triple.startswith(platform.machine())):
        raise UsageError(f"profile {profile.key} targets {triple or kind}: its tuned model runs "
                         f"on a phone of the key, not on this machine",
                         subject=f"device key {profile.key}",
                         hint=f"pass --tracker HOST:PORT, the tracker of a worker host with "
                              f"phones of key {profile.key}")


def check_name_free(store: JobReader, name: str | None) -> None:
    """`--name` held by a running job: refused before the model is read."""
    if name and store.holds_name(holder := store.job_named(name), ""):
        raise name_held(name, str(holder))


def name_held(name: str, holder: str) -> UsageError:
    return UsageError(f"the name is held by job {holder}, which runs", subject=f"--name {name}",
                      hint=f"pick another name, or `farm cancel {holder}`")


def wait_for_devices(store: HostRegistry, device_key: str, wait_s: float) -> None:
    """Fail fast (or wait `wait_s`) when no worker host has phones of `device_key`."""

    deadline = time.monotonic() + wait_s
    while True:
        found = store.hosts()
        if any(h.phones.get(device_key, {}).get("total", 0) > 0 for h in found):
            return
        if time.monotonic() >= deadline:
            have = sorted({k for h in found for k in h.phones}) or ["none"]
            raise ServiceError(f"no worker host has phones of key {device_key!r} "
                               f"(keys on the farm: {', '.join(have)})",
                               subject=f"device key {device_key}",
                               hint="start a worker whose tracker has such phones, or pass "
                                    "--wait-for-devices SECONDS")
        time.sleep(2)
