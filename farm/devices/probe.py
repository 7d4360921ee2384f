"""One real candidate through the whole path a round takes, on one phone of a key.

Built and linked on this host for the profile (farm/devices/cross.py), uploaded, loaded
and run on the phone, its output checked against the unscheduled kernel, timed by the
phone's runtime (farm/devices/evaluate.py): what every candidate of a job goes through. A
phone that cannot take this path cannot take a job's, so `farm doctor` runs it first and
fails with the phone's own error.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass

from farm.core.aliases import IRModule
from farm.core.errors import ServiceError
from farm.core.failures import brief
from farm.core.profiles import DeviceProfile
from farm.devices.cross import build_reference, export_shared, linker
from farm.devices.evaluate import alloc_on_phone, checked_run_evaluator, configure_threads
from farm.devices.tracker import request_session


@dataclass(frozen=True)
class Probe:
    phone: str  # the phone's address, as its tracker handed it out
    run_us: float  # the candidate's mean run time on the phone
    wall_ms: float  # the whole path: build, link, upload, load, check, time


def workload() -> IRModule:
    """A small matmul + bias + relu: a real operator, with a real schedule to apply."""
    import tvm
    from tvm import te, topi

    a = te.placeholder((64, 64), name="A")
    b = te.placeholder((64, 64), name="B")
    k = te.reduce_axis((0, 64), name="k")
    c = te.compute((64, 64), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    d = topi.nn.relu(c + 1.0)
    return tvm.IRModule({"main": te.create_prim_func([a, b, d]).with_attr("global_symbol",
                                                                           "main")})


def candidate(mod: IRModule, gpu: bool = False, threads: int = 16) -> IRModule:
    """A scheduled version of `mod`, as a search would make one: tiles and a vector loop on
    a CPU; on a GPU (OpenCL) every block's spatial loops bound to blocks and threads (a
    kernel unbound there does not build), `threads` a block."""
    from tvm import s_tir

    sch = s_tir.Schedule(mod)
    if gpu:
        sch.compute_inline(sch.get_sblock("T_add"))
        for name in ("C", "compute"):
            loops = sch.get_loops(sch.get_sblock(name))
            bx, tx = sch.split(sch.fuse(loops[0], loops[1]), [None, threads])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
        return sch.mod
    block = sch.get_sblock("C")
    i, j, k = sch.get_loops(block)
    io, ii = sch.split(i, [None, 8])
    jo, ji = sch.split(j, [None, 16])
    sch.reorder(io, jo, k, ii, ji)
    sch.vectorize(ji)
    return sch.mod


def probe_phone(tracker: str, profile: DeviceProfile, timeout_s: float = 60.0) -> Probe:
    """Send one candidate through the whole path to a phone of `profile.key`. Raises
    ServiceError naming the step that failed and the phone's own words."""
    import tvm
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.runner import EvaluatorConfig

    t0 = time.perf_counter()
    subject = f"phone of key {profile.key} (tracker {tracker})"
    target = tvm.target.Target(profile.target_json())
    mod = workload()
    with tempfile.TemporaryDirectory(prefix="farm-probe-") as work:
        step = "build and link on this host"
        gpu = target.kind.name != "llvm"
        try:
            path = export_shared(linker(profile), tvm.compile(candidate(mod, gpu), target=target))
            # the reference: TVM's default schedule (on a GPU its dlight one)
            reference = build_reference(mod, target, profile, work)
            step = "ask the tracker for a phone"
            session, phone = request_session(tracker, profile.key, timeout_s)
            if not gpu:  # the profile's threads and cores, as a round's sessions get them
                configure_threads(session, profile.threads, profile.affinity)
            step = f"upload and load on {phone}"
            session.upload(path, "probe.so")
            rt_mod = session.load_module("probe.so")
            step = f"run, check and time on {phone}"
            device = session.device(target.get_target_device_type(), 0)
            args_info = [a.as_json() for a in ArgInfo.from_prim_func(mod["main"])]
            args = alloc_on_phone(session, device, args_info, 1)
            config = EvaluatorConfig(number=profile.number, repeat=profile.repeat,
                                     min_repeat_ms=profile.min_repeat_ms,
                                     enable_cpu_cache_flush=profile.cache_flush)
            costs = checked_run_evaluator(reference, session, rt_mod, device, config, args)
        except ServiceError:
            raise
        except Exception as e:  # noqa: BLE001 - every failure is the phone's report
            raise ServiceError(f"{step} failed: {brief(str(e))}", subject=subject,
                               hint="see the phone's log; the README's section on real phones "
                                    "lists what a phone's RPC server must hold") from e
    return Probe(phone=phone, run_us=sum(costs) / len(costs) * 1e6,
                 wall_ms=(time.perf_counter() - t0) * 1e3)
