"""Device profiles: what a device key means (target, how candidates are exported, how timed).

A profile is part of the workload key: a record tuned for one profile is never
applied to another.  Profiles come from the built-in table below, overridden or
extended by `[profiles.<key>]` tables in `farm.toml`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace

from farm.core.aliases import JsonDict
from farm.core.errors import UsageError


@dataclass(frozen=True)
class DeviceProfile:
    """How to tune for one device key."""

    key: str
    target: JsonDict
    export: str = "local"  # "local": tar linked on the device; "cross": .so built on the host
    cc: str | None = None  # compiler for the "cross" export (e.g. "$TVM_NDK_CC")
    threads: int = 1  # threads a kernel may use on the device (TVM_NUM_THREADS of the phone)
    number: int = 3  # evaluator: runs per measurement
    repeat: int = 1  # evaluator: measurements per candidate
    # each measurement runs the kernel until it took >= this long (TVM's default): with 0, a
    # 5 us kernel is timed over 15 us and the ranking of candidates is mostly noise
    min_repeat_ms: int = 100
    cooldown_s: float = 0.0
    # the phone's cores a kernel's threads run on: "" (any: `threads` of them), "big" or
    # "little" (TVM's runtime pins them there: a phone's big cluster or its little one)
    affinity: str = ""
    cache_flush: bool = False  # flush the CPU caches before each run: cold-cache timing
    # heat (farm/devices/thermometer.py): a phone's thermometer kernel is timed every
    # `heat_check_s` (0: never); a reading more than `heat_share` slower than the phone's
    # fastest marks it hot: set aside for `heat_rest_s`, its measurements since its last cool
    # reading stored as unverified (measured again before one can be a best)
    heat_check_s: float = 60.0
    heat_share: float = 0.25
    heat_rest_s: float = 120.0
    notes: str = ""
    emulate: str = ""  # "arm64": the embedded farm's phones run this CPU under qemu
    check_outputs: bool = True  # compare each candidate's output with the unscheduled kernel
    # the target is the CPU of the machine the phones run on (emulated phones): its LLVM name
    # goes into the target as mcpu when the farm starts (`on_cpu`), so in the workload key
    host_cpu: bool = False
    extra: JsonDict = field(default_factory=dict)

    def on_cpu(self, cpu: str) -> DeviceProfile:
        """This profile for CPU `cpu` (LLVM's name, e.g. znver3 or icelake-server, with the
        features this machine hides turned off: "znver4,-avx512f,..."; farm/devices/hostcpu.py):
        with `host_cpu`, an LLVM target without mcpu gets it (and those features off, in
        mattr); otherwise unchanged."""
        if not self.host_cpu or not cpu:
            return self
        if self.target.get("kind") == "opencl":  # the phone's CPU runs the host code
            host = self.target.get("host") or {"kind": "llvm"}
            if isinstance(host, dict) and host.get("kind") == "llvm" and "mcpu" not in host:
                return replace(self, target={**self.target, "host": _with_cpu(host, cpu)})
            return self
        if self.target.get("kind") != "llvm" or "mcpu" in self.target:
            return self
        return replace(self, target=_with_cpu(self.target, cpu))

    def target_json(self) -> JsonDict:
        """The target as a JSON dict, with num-cores following the device's threads."""
        target = dict(self.target)
        if target.get("kind") == "llvm":
            target.setdefault("num-cores", self.threads)
        return target

    def to_json(self) -> JsonDict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: JsonDict) -> DeviceProfile:
        return cls(**data)


def _with_cpu(target: JsonDict, cpu: str) -> JsonDict:
    """An LLVM target dict for CPU `cpu` ("name" or "name,-feature,...")."""
    name, *off = cpu.split(",")
    out = {**target, "mcpu": name}
    own = list(target.get("mattr", []))
    if off:  # each once: a resumed job's CPU names its profile's own "-" features too
        out["mattr"] = [*own, *(a for a in off if a not in own)]
    return out


BUILTIN_PROFILES: dict[str, DeviceProfile] = {
    "cpu-local": DeviceProfile(
        key="cpu-local",
        target={"kind": "llvm"},
        threads=1,
        host_cpu=True,
        heat_check_s=0.0,  # phones on this host's cores: a reading would time the host's load
        notes="This machine's CPU (mcpu: LLVM's name of it, found when the farm starts), "
              "measured by emulated phones (local RPC servers).",
    ),
    "android-arm64": DeviceProfile(
        key="android-arm64",
        target={
            "kind": "llvm",
            "mtriple": "aarch64-linux-android",
            "mattr": ["+neon"],
        },
        export="cross",
        cc="$TVM_NDK_CC",
        threads=4,
        notes="An Android phone running the TVM RPC app; set TVM_NDK_CC to the NDK clang++.",
    ),
    # the common big (and little) cores of Android phones: mcpu lets LLVM schedule for the
    # core and use what it has (dot products, its pipeline), as cpu-local does for this host
    **{f"android-{core}": DeviceProfile(
        key=f"android-{core}",
        target={"kind": "llvm", "mtriple": "aarch64-linux-android", "mcpu": core,
                "mattr": ["+neon"]},
        export="cross",
        cc="$TVM_NDK_CC",
        threads=threads,
        notes=f"An Android phone's {core} cores ({phones}) through the TVM RPC app; set "
              "TVM_NDK_CC to the NDK clang++.",
    ) for core, threads, phones in (
        ("cortex-a76", 4, "e.g. Snapdragon 855/865, Kirin 980/990, Dimensity 1000"),
        ("cortex-a78", 4, "e.g. Snapdragon 778G, Dimensity 1200, Exynos 1280"),
        ("cortex-x1", 1, "the prime core of Snapdragon 888, Exynos 2100, Google Tensor"),
        ("cortex-x3", 1, "the prime core of Snapdragon 8 Gen 2, Dimensity 9200"),
        ("cortex-a55", 4, "the little cores of most phones since 2018"),
    )},
    "android-arm64-opencl": DeviceProfile(
        key="android-arm64-opencl",
        target={
            "kind": "opencl",
            "host": {"kind": "llvm", "mtriple": "aarch64-linux-android", "mattr": ["+neon"]},
        },
        export="cross",
        cc="$TVM_NDK_CC",
        threads=4,
        notes="A phone's GPU of unknown make through OpenCL (TVM's default limits: `farm "
              "doctor` compares them with the phone's); the TVM RPC app built with OpenCL "
              "(README: phone GPUs).",
    ),
    # phone GPUs through OpenCL: the limits are their vendors' (clinfo's work-group size and
    # local memory); `farm doctor` reads the phone's own and refuses a profile that claims more
    **{f"android-{gpu}": DeviceProfile(
        key=f"android-{gpu}",
        target={"kind": "opencl", "device": device, "max_threads_per_block": threads,
                "max_num_threads": threads, "max_shared_memory_per_block": local,
                "thread_warp_size": 1,
                "host": {"kind": "llvm", "mtriple": "aarch64-linux-android", "mattr": ["+neon"]}},
        export="cross",
        cc="$TVM_NDK_CC",
        threads=1,
        notes=f"{name} through OpenCL ({phones}): the TVM RPC app built with OpenCL (README: "
              f"phone GPUs); set TVM_NDK_CC to the NDK clang++.",
    ) for gpu, device, threads, local, name, phones in (
        ("mali-bifrost", "mali", 384, 32768, "An Arm Mali Bifrost GPU (G52, G72, G76)",
         "e.g. Kirin 980, Exynos 9820, Helio P90"),
        ("mali-valhall", "mali", 512, 32768, "An Arm Mali Valhall GPU (G57, G77, G78, G710)",
         "e.g. Dimensity 1200, Exynos 2100, Google Tensor"),
        ("adreno-6xx", "adreno", 1024, 32768, "A Qualcomm Adreno 6xx GPU (618, 640, 650, 660)",
         "e.g. Snapdragon 730, 855, 865, 888"),
        ("adreno-7xx", "adreno", 1024, 32768, "A Qualcomm Adreno 7xx GPU (730, 740, 750)",
         "e.g. Snapdragon 8 Gen 1, 2, 3"),
    )},
    "opencl-local": DeviceProfile(
        key="opencl-local",
        target={"kind": "opencl", "host": {"kind": "llvm"}},
        host_cpu=True,
        heat_check_s=0.0,  # phones on this host's cores: a reading would time the host's load
        notes="This machine's OpenCL device (pocl's CPU device where there is no GPU) on "
              "emulated phones with TVM's OpenCL runtime (`farm phones --opencl`; built from "
              "TVM_SOURCE); the limits are the phone's own, read when the farm starts.",
    ),
    "arm64-sim": DeviceProfile(
        key="arm64-sim",
        target={"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]},
        export="cross",
        cc="aarch64-linux-gnu-g++",
        threads=1,
        # under qemu the timings rank qemu's speed, not a real core's; a measurement is still
        # a few runs of at least 20 ms: with one run (number=1, min_repeat_ms=0) a lucky
        # sample won the round and the tuned model timed slower than the untuned one (CI)
        number=3,
        min_repeat_ms=20,
        emulate="arm64",
        heat_check_s=0.0,  # qemu on this host's cores: a reading would time the host's load
        notes="An emulated arm64 phone: aarch64 TVM under qemu user mode on this machine "
              "(`farm phones --arch arm64`); cross-compiled like an NDK profile.",
    ),
}


def canonical_target(target: JsonDict) -> str:
    """The canonical JSON text of a target dict (sorted keys, no spaces)."""
    return json.dumps(target, sort_keys=True, separators=(",", ":"))


def known_keys(overrides: dict[str, JsonDict] | None = None) -> list[str]:
    """The device keys with a profile: built in, then those `farm.toml` adds."""
    return [*BUILTIN_PROFILES, *sorted(set(overrides or {}) - set(BUILTIN_PROFILES))]


def resolve_profile(key: str, overrides: dict[str, JsonDict] | None = None,
                    strict: bool = False) -> DeviceProfile:
    """The profile of device key `key`: built-in, then `farm.toml` overrides.

    A key with no profile anywhere is refused when `strict` (the submit side: a typo must not
    silently tune for this machine's CPU), and otherwise means this machine's CPU (a worker
    serves whatever keys its phones registered under; a lab may name its phones freely)."""
    overrides = overrides or {}
    base = BUILTIN_PROFILES.get(key)
    if strict and base is None and key not in overrides:
        raise UsageError(f"no profile for device key {key!r}; known keys: "
                         f"{', '.join(known_keys(overrides))}", subject=f"device key {key}",
                         hint=f"pick a known key, or describe the device in farm.toml: a "
                              f"[profiles.{key}] table, e.g. with target = {{ kind = \"llvm\" }} "
                              f"for this CPU")
    return _build(key, overrides.get(key, {}), f"profile {key}")


_TYPES: dict[str, tuple[type, ...]] = {
    "key": (str,), "target": (dict,), "export": (str,), "cc": (str, type(None)),
    "threads": (int,), "number": (int,), "repeat": (int,), "min_repeat_ms": (int,),
    "cooldown_s": (int, float), "affinity": (str,), "cache_flush": (bool,), "notes": (str,), "emulate": (str,), "check_outputs": (bool,),
    "heat_check_s": (int, float), "heat_share": (int, float), "heat_rest_s": (int, float),
    "host_cpu": (bool,), "extra": (dict,),
}
_CHOICES = {"export": ("local", "cross"), "emulate": ("", "arm64"),
            "affinity": ("", "big", "little")}
_MINIMUM = {"threads": 1, "number": 1, "repeat": 1, "min_repeat_ms": 0, "cooldown_s": 0,
            "heat_check_s": 0, "heat_share": 0.01, "heat_rest_s": 0}


def _build(key: str, override: JsonDict, subject: str) -> DeviceProfile:
    """The built-in profile of `key` (this CPU's when there is none), with `override`'s
    settings checked one by one: known, of their type (`threads = "4"` and `threads = true`
    are refused, not coerced), in range."""
    hint = "see the README's section on tuning for phones"
    if not isinstance(override, dict):
        raise UsageError(f"a profile must be a table of settings, got {override!r}",
                         subject=subject, hint=f"write it as [profiles.{key}]")
    unknown = sorted(set(override) - set(_TYPES))
    if unknown:
        raise UsageError(f"unknown settings {unknown}; known: {', '.join(_TYPES)}",
                         subject=subject, hint=hint)
    if override.get("key", key) != key:
        raise UsageError(f"key = {override['key']!r} differs from the table's name {key!r}",
                         subject=subject, hint=f"drop key from [profiles.{key}]")
    for name, value in override.items():
        kinds = _TYPES[name]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            want = " or ".join(k.__name__ for k in kinds if k is not type(None))
            raise UsageError(f"{name} must be of type {want}, got {value!r} "
                             f"({type(value).__name__})", subject=subject,
                             hint=f"e.g. {name} = {_example(name)}")
        if name in _CHOICES and value not in _CHOICES[name]:
            raise UsageError(f"{name} must be one of {list(_CHOICES[name])}, got {value!r}",
                             subject=subject, hint=hint)
        if name in _MINIMUM and (not math.isfinite(value) or value < _MINIMUM[name]):  # type: ignore[arg-type, operator]
            raise UsageError(f"{name} must be a finite number >= {_MINIMUM[name]}, got "
                             f"{value!r}", subject=subject, hint=f"e.g. {name} = {_example(name)}")
    base = BUILTIN_PROFILES.get(key)
    data: JsonDict = (
        base.to_json() if base else {**BUILTIN_PROFILES["cpu-local"].to_json(), "notes": ""}
    )
    data.update(override, key=key)
    profile = DeviceProfile.from_json(data)
    target = profile.target
    if "kind" not in target or not isinstance(target["kind"], str):
        raise UsageError("target must be a table with a 'kind' (e.g. target = { kind = \"llvm\" })",
                         subject=subject, hint=hint)
    return profile


def _example(name: str) -> str:
    value = getattr(BUILTIN_PROFILES["cpu-local"], name)
    return json.dumps(value) if not isinstance(value, bool) else str(value).lower()


def check_overrides(profiles: object, where: str) -> dict[str, JsonDict]:
    """`[profiles.*]` of a farm.toml at `where`, each checked at once (a bad profile is found
    when the config is loaded, not when a round first uses it)."""
    if not isinstance(profiles, dict):
        raise UsageError(f"profiles must be tables [profiles.KEY], got {profiles!r}",
                         subject=where)
    for key, override in profiles.items():
        _build(key, override, f"{where} [profiles.{key}]")
    return profiles
