"""What built a batch of candidates: the host, its TVM and its compilers.

A lent round's kernels are built on a helper host and measured on the phone host's phones
(workers/round/lend/: helper_side.py, phone_side.py), so the two hosts' TVM and compilers can differ. Each
batch a helper hands over says who built it (`BuildIdentity`); the phone host compares it
with its own before it measures: a batch built by another TVM version is refused (not
measured; the round searches on here), a batch built by other compilers (another LLVM, another
linker) is measured, and its records say so. Every record a round commits names its builder
(`StoredRecord.tvm`: the builder's TVM; `StoredRecord.builder`: its host and compilers).
"""

from __future__ import annotations

import functools
import logging
import os
import subprocess
from dataclasses import asdict, dataclass

from farm.core.aliases import JsonDict
from farm.core.errors import FarmError
from farm.core.profiles import DeviceProfile
from farm.devices.cross import linker

log = logging.getLogger(__name__)
SCHEMA = 1


@dataclass(frozen=True)
class BuildIdentity:
    """The host that built a batch, its TVM version, the LLVM TVM generated code with and the
    compiler that linked the kernels (the profile's cross compiler, or the machine's), each
    "" when unknown. Crosses processes as JSON inside a lent batch."""

    host: str
    tvm: str
    llvm: str = ""
    linker: str = ""

    def to_json(self) -> JsonDict:
        return {**asdict(self), "schema": SCHEMA}

    @classmethod
    def from_json(cls, data: object) -> BuildIdentity:
        """ValueError when `data` is no build identity of this schema."""
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ValueError(f"not a build identity of schema {SCHEMA}: {str(data)[:200]}")
        if not isinstance(data.get("host"), str) or not isinstance(data.get("tvm"), str):
            raise ValueError(f"a build identity names its host and TVM: {str(data)[:200]}")
        return cls(data["host"], data["tvm"], str(data.get("llvm", "")),
                   str(data.get("linker", "")))

    @property
    def compilers(self) -> str:
        """The compilers, as a record's `builder` says them after the host."""
        return f"LLVM {self.llvm or '?'}, {self.linker or 'linker ?'}"

    @property
    def stamp(self) -> str:
        """What a record built by this identity says in `StoredRecord.builder`."""
        return f"{self.host}: {self.compilers}"

    def refuses(self, theirs: BuildIdentity) -> str | None:
        """Why a batch built by `theirs` is not measured by this host (None: it is): another
        TVM version (its kernels and records are another TVM's)."""
        if theirs.tvm != self.tvm:
            return (f"{theirs.host} built it with TVM {theirs.tvm or '(unknown)'}, "
                    f"{self.host} runs TVM {self.tvm}")
        return None

    def differs(self, theirs: BuildIdentity) -> str | None:
        """How `theirs` compilers differ from this host's, where both are known (None: same)."""
        diff = [f"{what} {b} there, {a} here" for what, a, b in (
            ("LLVM", self.llvm, theirs.llvm), ("linker", self.linker, theirs.linker))
            if a and b and a != b]
        return "; ".join(diff) or None


def this_host(host: str, profile: DeviceProfile) -> BuildIdentity:
    """This host's identity as a builder of the profile's kernels."""
    import tvm

    return BuildIdentity(host, str(tvm.__version__), _llvm(), _linker(profile))


@functools.lru_cache(maxsize=1)
def _llvm() -> str:
    import tvm

    major = tvm.get_global_func("target.llvm_version_major", allow_missing=True)
    return str(major()) if major is not None else ""


def _linker(profile: DeviceProfile) -> str:
    """The profile's linker and its version ("" when it has none here: a phone host may
    lack the cross compiler its helpers build with)."""

    try:
        cc = linker(profile)
    except FarmError:
        return ""
    if cc is None:
        from tvm.support.cc import get_cc

        cc = get_cc()
    return _version(cc) if cc else ""


@functools.lru_cache(maxsize=8)
def _version(cc: str) -> str:
    try:
        got = subprocess.run([cc, "-dumpversion"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("compiler %s: no version: %s", cc, e)
        return os.path.basename(cc)
    return f"{os.path.basename(cc)} {got.stdout.strip()}".strip()
