"""The CPU a target is for, and whether a CPU can run code built for it.

`cpu-local` means "this machine's CPU, measured by emulated phones": its target names the
CPU (`mcpu`), so LLVM uses its vector units (AVX2, AVX-512, FMA) instead of baseline
x86-64, and the workload key tells records tuned for one CPU from records tuned for
another. A worker host refuses a round whose target needs an instruction its CPU lacks.

LLVM names a CPU by its model (cpuid's family and model), not by what the machine lets a
program run: a virtual machine may hide part of its CPU (a cloud's AMD EPYC that LLVM calls
znver4 with AVX-512 masked by the hypervisor). Code for mcpu=znver4 then dies of SIGILL in
every session. So this machine's CPU is its LLVM name and the instruction-set features that
name implies and the kernel does not list (/proc/cpuinfo), turned off: "znver4,-avx512f,...",
`mcpu` and `mattr` of the target (`DeviceProfile.on_cpu`, `split_cpu`).
"""

from __future__ import annotations

import functools
import platform
import re

from farm.core.aliases import JsonDict
from farm.core.errors import UsageError
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
    """This machine's CPU: LLVM's name of it ("" when LLVM only knows it as generic), with
    ",-feature" for each instruction-set feature the name implies that this machine does
    not run (see the module's docstring)."""
    from tvm.target import codegen

    name = cpu_name(codegen.llvm_get_system_cpu())
    return ",".join([name, *(f"-{f}" for f in hidden_features(name))]) if name else ""


def split_cpu(cpu: str) -> tuple[str, list[str]]:
    """A CPU as `system_cpu` writes it -> (mcpu, mattr)."""
    name, *attrs = cpu.split(",")
    return name, attrs


def cpu_of_target(target: JsonDict) -> str:
    """The CPU a target was made for, as `system_cpu` writes it (an OpenCL target's host's):
    its mcpu and the features its mattr turns off ("" when it names no CPU)."""
    llvm = target.get("host") if target.get("kind") == "opencl" else target
    if not isinstance(llvm, dict) or not llvm.get("mcpu"):
        return ""
    off = [str(a) for a in llvm.get("mattr", []) if str(a).startswith("-")]
    return ",".join([str(llvm["mcpu"]), *off])


# LLVM's feature names that the kernel's /proc/cpuinfo writes otherwise (after dropping "_",
# "." and "-": sse4.1 and sse4_1 are both sse41)
_CPUINFO_NAMES = {"sse3": "pni", "lzcnt": "abm", "bmi": "bmi1", "sha": "shani",
                  "pclmul": "pclmulqdq"}


def _plain(name: str) -> str:
    return re.sub(r"[._-]", "", name.lower())


def _cpuinfo_flags(text: str | None = None) -> set[str]:
    """The instruction-set flags this machine's kernel lists (empty: unknown here)."""
    if text is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                text = f.read()
        except OSError:
            return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return {_plain(f) for f in line.split(":", 1)[1].split()}
    return set()


def hidden_features(name: str, flags: set[str] | None = None) -> list[str]:
    """The instruction-set features LLVM's CPU `name` implies that this x86 machine's kernel
    does not list (its `flags`, default /proc/cpuinfo's): code using them would not run."""
    if flags is None:
        if platform.machine().lower() not in ("x86_64", "amd64"):
            return []
        flags = _cpuinfo_flags()
    if not flags:
        return []
    implied = _features({"kind": "llvm", "mcpu": name})
    return sorted(f for f in implied if _plain(_CPUINFO_NAMES.get(f, f)) not in flags)


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
        host["mcpu"], attrs = split_cpu(cpu)
        if attrs:
            host["mattr"] = attrs
    return sorted(_features(target_json) - _features(host))


def cpu_for_key(beats: list[HostBeat], device_key: str) -> str | None:
    """The CPU of the worker hosts with phones of `device_key`, from their heartbeats (None:
    no host says). Hosts of one key on different CPUs are refused: a record tuned on one is
    not the best on the other, so each needs its own device key."""

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
