"""cpu-local names the real CPU: in the target, so in the workload key; a host refuses a
target its CPU cannot run."""

from __future__ import annotations

import platform

import pytest

from farm.core.errors import TuneError, UsageError
from farm.core.profiles import resolve_profile
from farm.devices.hostcpu import cpu_for_key, missing_features, system_cpu
from farm.pipeline.extract import workload_key
from farm.store.hosts import HostBeat

x86 = pytest.mark.skipif(platform.machine() != "x86_64", reason="x86 CPU names")


def test_cpu_local_targets_the_cpu_it_is_given_and_keys_records_by_it():
    base = resolve_profile("cpu-local")
    assert base.host_cpu and "mcpu" not in base.target
    a, b = base.on_cpu("znver3"), base.on_cpu("icelake-server")
    assert a.target_json() == {"kind": "llvm", "mcpu": "znver3", "num-cores": 1}
    assert workload_key(123, a.target_json(), a.key) != workload_key(123, b.target_json(), b.key)
    assert base.on_cpu("") == base  # LLVM knows the CPU only as generic: baseline code
    pinned = resolve_profile("cpu-local", {"cpu-local": {"target": {"kind": "llvm",
                                                                     "mcpu": "haswell"}}})
    assert pinned.on_cpu("znver3").target["mcpu"] == "haswell"  # farm.toml pins it
    phone = resolve_profile("android-arm64")
    assert phone.on_cpu("znver3") == phone  # a phone's CPU is not this machine's


def test_the_host_cpu_is_known_here():
    assert system_cpu()  # LLVM knows this machine's CPU by name (not generic)
    assert missing_features({"kind": "llvm", "mcpu": system_cpu()}, system_cpu()) == []


@x86
def test_a_cpu_that_lacks_a_targets_instructions_is_found():
    assert "avx512f" in missing_features({"kind": "llvm", "mcpu": "skylake-avx512"}, "haswell")
    assert {"avx2", "fma"} <= set(missing_features({"kind": "llvm", "mcpu": "haswell"},
                                                   "x86-64"))
    assert missing_features({"kind": "llvm", "mcpu": "haswell"}, "skylake-avx512") == []
    assert missing_features({"kind": "llvm"}, "x86-64") == []  # baseline runs everywhere


def beat(name: str, cpu: str, key: str = "cpu-local", total: int = 2) -> HostBeat:
    return HostBeat(name=name, tracker="t", phones={key: {"total": total}}, cpu=cpu)


def test_the_lab_cpu_of_a_key_comes_from_its_hosts():
    assert cpu_for_key([beat("a", "znver3"), beat("b", "znver3")], "cpu-local") == "znver3"
    assert cpu_for_key([beat("a", "znver3", total=0)], "cpu-local") is None
    assert cpu_for_key([beat("a", "")], "cpu-local") is None  # an older worker says nothing
    assert cpu_for_key([beat("a", "znver3", key="other")], "cpu-local") is None
    with pytest.raises(UsageError, match="different CPUs"):
        cpu_for_key([beat("a", "znver3"), beat("b", "icelake-server")], "cpu-local")


def foreign_cpu() -> str:
    """An x86 CPU whose code this machine cannot run (one with instructions it lacks)."""
    for cpu in ("sapphirerapids", "graniterapids", "skylake-avx512", "znver4", "haswell"):
        if missing_features({"kind": "llvm", "mcpu": cpu}, system_cpu()):
            return cpu
    pytest.skip("this machine runs every CPU's code of the list")


@x86
def test_a_worker_refuses_a_round_its_cpu_cannot_run():
    from workers.round.measure import check_cpu

    profile = resolve_profile("cpu-local")
    cpu = foreign_cpu()
    with pytest.raises(TuneError, match=f"cannot run code for target mcpu={cpu}"):
        check_cpu(profile, {"kind": "llvm", "mcpu": cpu}, "here")
    check_cpu(profile, profile.on_cpu(system_cpu()).target_json(), "here")  # its own: runs
    check_cpu(resolve_profile("android-arm64"), {"kind": "llvm", "mcpu": cpu}, "here")


def test_a_cpu_whose_machine_hides_features_is_that_cpu_with_them_off():
    """A VM whose CPU LLVM calls znver4 with AVX-512 masked (its kernel lists no avx512*):
    code for mcpu=znver4 died of SIGILL in every session; the features it hides are off."""
    from farm.core.profiles import resolve_profile
    from farm.devices.hostcpu import _cpuinfo_flags, hidden_features, missing_features

    text = ("processor\t: 0\nflags\t\t: fpu sse sse2 pni ssse3 sse4_1 sse4_2 popcnt avx avx2 fma "
            "f16c bmi1 bmi2 abm movbe adx aes sha_ni pclmulqdq vaes vpclmulqdq cx16 sse4a xsaveopt "
            "xsavec xsaves xsave\n")
    flags = _cpuinfo_flags(text)
    hidden = hidden_features("znver4", flags)
    assert "avx512f" in hidden and "avx512bw" in hidden
    assert not {"avx2", "fma", "sse4.1", "sse3", "lzcnt", "bmi", "sha", "pclmul"} & set(hidden)
    cpu = ",".join(["znver4", *(f"-{f}" for f in hidden)])
    target = resolve_profile("cpu-local").on_cpu(cpu).target
    assert target["mcpu"] == "znver4" and "-avx512f" in target["mattr"]
    assert missing_features(target, cpu) == []  # it runs here
    assert "avx512f" in missing_features({"kind": "llvm", "mcpu": "znver4"}, cpu)
    every = text.replace("xsave\n", "xsave avx512f avx512bw avx512cd avx512dq avx512vl "
                         "avx512ifma avx512vbmi avx512_vbmi2 avx512_vnni avx512_bitalg "
                         "avx512_vpopcntdq avx512_bf16 gfni\n")
    assert hidden_features("znver4", _cpuinfo_flags(every)) == []  # a machine that shows all


def test_a_job_tuned_for_a_cpu_with_features_off_is_resumed_for_the_same_target():
    """`farm resume` and `farm wait` rebuild the job's tasks for the CPU its target names: with
    only its mcpu (the features it hides dropped) the workload keys differed, and the job "no
    longer gives the job's tuning tasks" (a clean-clone run of 2026-12-07, on a VM hiding
    AVX-512). The same for an OpenCL target, whose host names the CPU."""
    from farm.core.profiles import DeviceProfile, resolve_profile
    from farm.devices.hostcpu import cpu_of_target

    cpu = "znver4,-avx512f,-avx512bw"
    for profile in (resolve_profile("cpu-local"), resolve_profile("opencl-local"),
                    DeviceProfile(key="mine", target={"kind": "llvm", "mattr": ["-sse4a"]},
                                  host_cpu=True)):
        tuned = profile.on_cpu(cpu).target
        again = profile.on_cpu(cpu_of_target(tuned)).target
        assert again == tuned and cpu_of_target(tuned).startswith("znver4,"), (tuned, again)
    assert cpu_of_target({"kind": "llvm"}) == ""
    assert cpu_of_target({"kind": "llvm", "mcpu": "cortex-a76", "mattr": ["+neon"]}) == "cortex-a76"
