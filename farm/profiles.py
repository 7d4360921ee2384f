"""Device profiles: what a device key means (target, how candidates are exported, how timed).

A profile is part of the workload key: a record tuned for one profile is never
applied to another.  Profiles come from the built-in table below, overridden or
extended by `[profiles.<key>]` tables in `farm.toml`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from farm.errors import UsageError


@dataclass(frozen=True)
class DeviceProfile:
    """How to tune for one device key."""

    key: str
    target: dict[str, Any]
    export: str = "local"  # "local": tar linked on the device; "cross": .so built on the host
    cc: str | None = None  # compiler for the "cross" export (e.g. "$TVM_NDK_CC")
    threads: int = 1  # threads a kernel may use on the device (TVM_NUM_THREADS of the phone)
    number: int = 3  # evaluator: runs per measurement
    repeat: int = 1  # evaluator: measurements per candidate
    # each measurement runs the kernel until it took >= this long (TVM's default): with 0, a
    # 5 us kernel is timed over 15 us and the ranking of candidates is mostly noise
    min_repeat_ms: int = 100
    cooldown_s: float = 0.0
    notes: str = ""
    emulate: str = ""  # "arm64": the embedded farm's phones run this CPU under qemu
    check_outputs: bool = True  # compare each candidate's output with the unscheduled kernel
    extra: dict[str, Any] = field(default_factory=dict)

    def target_json(self) -> dict[str, Any]:
        """The target as a JSON dict, with num-cores following the device's threads."""
        target = dict(self.target)
        if target.get("kind") == "llvm":
            target.setdefault("num-cores", self.threads)
        return target

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeviceProfile:
        return cls(**data)


BUILTIN_PROFILES: dict[str, DeviceProfile] = {
    "cpu-local": DeviceProfile(
        key="cpu-local",
        target={"kind": "llvm"},
        threads=1,
        notes="This machine's CPU, measured by emulated phones (local RPC servers).",
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
    "android-arm64-opencl": DeviceProfile(
        key="android-arm64-opencl",
        target={
            "kind": "opencl",
            "host": {"kind": "llvm", "mtriple": "aarch64-linux-android", "mattr": ["+neon"]},
        },
        export="cross",
        cc="$TVM_NDK_CC",
        threads=4,
        notes="The phone's GPU through OpenCL. The PyPI TVM build generates OpenCL code but "
              "has no OpenCL runtime: only phones whose TVM RPC app is built with OpenCL can "
              "run it (not the embedded farm's emulated phones).",
    ),
    "arm64-sim": DeviceProfile(
        key="arm64-sim",
        target={"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]},
        export="cross",
        cc="aarch64-linux-gnu-g++",
        threads=1,
        number=1,
        min_repeat_ms=0,  # under qemu the timings rank nothing real; keep its rounds short
        emulate="arm64",
        notes="An emulated arm64 phone: aarch64 TVM under qemu user mode on this machine "
              "(`farm phones --arch arm64`); cross-compiled like an NDK profile.",
    ),
}


def canonical_target(target: dict[str, Any]) -> str:
    """The canonical JSON text of a target dict (sorted keys, no spaces)."""
    return json.dumps(target, sort_keys=True, separators=(",", ":"))


def resolve_profile(key: str, overrides: dict[str, dict[str, Any]] | None = None) -> DeviceProfile:
    """The profile of device key `key`: built-in, then `farm.toml` overrides; unknown keys
    default to this machine's CPU (a lab may name its phones freely)."""
    overrides = overrides or {}
    base = BUILTIN_PROFILES.get(key)
    data: dict[str, Any] = (
        base.to_json() if base else {**BUILTIN_PROFILES["cpu-local"].to_json(), "notes": ""}
    )
    data["key"] = key
    data.update(overrides.get(key, {}))
    try:
        profile = DeviceProfile.from_json(data)
    except TypeError as e:
        raise UsageError(f"bad device profile: {e}", subject=f"profile {key}",
                         hint="see the README's farm.toml section") from e
    if not isinstance(profile.target, dict) or "kind" not in profile.target:
        raise UsageError("target must be a JSON dict with a 'kind'", subject=f"profile {key}")
    if profile.threads < 1:
        raise UsageError("threads must be >= 1", subject=f"profile {key}")
    return profile
