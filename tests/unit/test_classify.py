import pytest

from workers.metaschedule.runner import classify_run_error


@pytest.mark.parametrize("msg,cls", [
    ("RPCRunner: Timeout, killed after 21 seconds", "device_lost"),
    ("RPCRunner: An exception occurred\nConnectionResetError: [Errno 104] reset by peer",
     "device_lost"),
    ("RPCRunner: An exception occurred\nRuntimeError: Cannot request cpu-local after 5 retry",
     "device_lost"),
    ("RPCRunner: An exception occurred\nTVMError: RPCSessionTimeoutError: timeout", "timeout"),
    ("RPCRunner: An exception occurred\nTVMError: Assert fail: buffer misaligned", "runtime"),
])
def test_classify_run_error(msg, cls):
    assert classify_run_error(msg) == cls


def test_a_candidate_that_keeps_losing_phones_is_stored_as_the_culprit():
    import tvm
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.builder import BuilderResult
    from tvm.s_tir.meta_schedule.database import Workload
    from tvm.s_tir.meta_schedule.runner import RunnerResult
    from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate

    from farm.store import open_store
    from farm.store.store import CULPRIT_AFTER
    from tests.unit.test_cache import matmul_mod
    from workers.metaschedule.callback import Provenance, RoundCounters, StoreCallback
    from workers.metaschedule.search import TunedWorkload

    store = open_store("memory://")
    mod = matmul_mod(16)
    cand = MeasureCandidate(Schedule(mod), ArgInfo.from_prim_func(mod["main"]))
    built = BuilderResult("/nonexistent.tar", None)
    lost = RunnerResult(None, "RPCRunner: Timeout, killed after 21 seconds")
    counters = RoundCounters()
    tuned = TunedWorkload("wk", Workload(mod), tvm.target.Target({"kind": "llvm"}))
    cb = StoreCallback(store, tuned, Provenance("j", "here"), counters)
    for _ in range(CULPRIT_AFTER - 1):  # retried: not stored, it may have been the phone's fault
        cb([cand], [built], [lost])
    assert store.record_count("wk") == 0 and counters.device_lost == CULPRIT_AFTER - 1
    cb([cand], [built], [lost])  # once more: this candidate is the culprit
    [rec] = store.records("wk")
    assert rec.error_class == "culprit" and not rec.valid
    assert f"lost a phone {CULPRIT_AFTER} times" in rec.error_msg
    assert counters.failures["culprit"] == 1 and counters.device_lost == CULPRIT_AFTER - 1


def _kernel(offset: float):
    import tvm
    from tvm import te

    a = te.placeholder((64,), name="A")
    b = te.compute((64,), lambda i: a[i] * 2.0 + offset, name="B")
    return tvm.IRModule({"main": te.create_prim_func([a, b])})


def test_a_candidate_with_a_wrong_output_is_a_wrong_answer(tmp_path):
    import numpy as np
    import tvm
    from tvm import rpc
    from tvm.s_tir.meta_schedule.runner import EvaluatorConfig

    from farm.core.profiles import resolve_profile
    from farm.devices.cross import build_reference
    from farm.devices.evaluate import checked_run_evaluator

    target = tvm.target.Target({"kind": "llvm"})
    ref = build_reference(_kernel(1.0), target, resolve_profile("cpu-local"), str(tmp_path))
    session = rpc.LocalSession()
    dev = session.cpu(0)

    def loaded(offset: float):
        path = tmp_path / f"cand{offset}.so"
        tvm.compile(_kernel(offset), target=target).export_library(str(path))
        session.upload(str(path), path.name)
        return session.load_module(path.name)

    args = [[tvm.runtime.tensor(np.random.rand(64).astype("float32"), dev),
             tvm.runtime.tensor(np.zeros(64, dtype="float32"), dev)]]
    cfg = EvaluatorConfig(number=1, repeat=1, min_repeat_ms=0)
    costs = checked_run_evaluator(ref, session, loaded(1.0), dev, cfg, args)  # right: timed
    assert len(costs) == 1 and costs[0] > 0
    with pytest.raises(RuntimeError, match="wrong answer: argument 1 differs") as err:
        checked_run_evaluator(ref, session, loaded(1.5), dev, cfg, args)
    assert classify_run_error(f"RPCRunner: An exception occurred\nRuntimeError: {err.value}") \
        == "wrong_answer"
