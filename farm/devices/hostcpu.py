"""The CPU a target is for, and whether a CPU can run code built for it.

`cpu-local` means "this machine's CPU, measured by emulated phones": its target names the
CPU (`mcpu`), so LLVM uses its vector units (AVX2, AVX-512, FMA) instead of baseline
x86-64, and the workload key tells records tuned for one CPU from records tuned for
another. A worker host refuses a round whose target needs an instruction its CPU lacks.
"""

from __future__ import annotations

import functools
import re

from farm.core.aliases import JsonDict
from farm.store.hosts import HostBeat

# instruction-set features (not LLVM's tuning flags such as "fast-gather" or "slow-3ops-lea",
# which change code quality, never whether the code runs)
_ISA = re.compile(r"^(avx|sse|ssse|fma|f16c|bmi|amx|aes|sha|pclmul|vpclmulqdq|gfni|vaes|"
                  r"popcnt|lzcnt|movbe|adx|cx16|xsave|neon|sve|dotprod|i8mm|fp16|fullfp16|"
                  r"bf16|crypto|lse|rdm|fp-armv8|v8|v9)")


def cpu_name(llvm_name: object) -> str:
    """A CPU name as LLVM reports it, "" when LLVM only knows it as generic."""
    name = str(llvm_name or "")
    return "" if name in ("generic", "x86-64") else name


@functools.cache
def system_cpu() -> str:
    """LLVM's name of this machine's CPU ("" when LLVM only knows it as generic)."""
    from tvm.target import codegen

    return cpu_name(codegen.llvm_get_system_cpu())


def _features(target_json: JsonDict) -> set[str]:
    import tvm
    from tvm.target import codegen

    feats = codegen.llvm_get_cpu_features(tvm.target.Target(target_json))
    return {str(f) for f in feats if _ISA.match(str(f))}


def missing_features(target_json: JsonDict, cpu: str) -> list[str]:
    """Instruction-set features code for `target_json` may use that CPU `cpu` lacks (empty:
    it runs there). Only for LLVM CPU targets of this machine's architecture."""
    if target_json.get("kind") != "llvm" or not (target_json.get("mcpu")
                                                 or target_json.get("mattr")):
        return []
    host = {k: v for k, v in target_json.items() if k not in ("mcpu", "mattr")}
    if cpu:
        host["mcpu"] = cpu
    return sorted(_features(target_json) - _features(host))


def cpu_for_key(beats: list[HostBeat], device_key: str) -> str | None:
    """The CPU of the worker hosts with phones of `device_key`, from their heartbeats (None:
    no host says). Hosts of one key on different CPUs are refused: a record tuned on one is
    not the best on the other, so each needs its own device key."""
    from farm.core.errors import UsageError

    cpus = {b.cpu for b in beats if b.cpu and b.phones.get(device_key, {}).get("total", 0) > 0}
    if len(cpus) > 1:
        raise UsageError(f"the hosts with phones of key {device_key} run on different CPUs "
                         f"({', '.join(sorted(cpus))})", subject=f"device key {device_key}",
                         hint="give each CPU its own device key (farm.toml [profiles.KEY] with "
                              "host_cpu = true), or pin one with target.mcpu")
    return cpus.pop() if cpus else None


@functools.cache
def this_cpu() -> tuple[str, str]:
    """LLVM's name of this machine's CPU and its triple: what an emulated phone of this
    machine says it is (it cannot ask LLVM itself: it holds TVM's runtime only)."""
    from tvm.target import codegen

    return system_cpu(), str(codegen.llvm_get_system_triple())
