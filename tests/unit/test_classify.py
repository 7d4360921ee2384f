import pytest

from workers.runner import classify_run_error


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
    from workers.callback import RoundCounters, StoreCallback

    store = open_store("memory://")
    mod = matmul_mod(16)
    cand = MeasureCandidate(Schedule(mod), ArgInfo.from_prim_func(mod["main"]))
    built = BuilderResult("/nonexistent.tar", None)
    lost = RunnerResult(None, "RPCRunner: Timeout, killed after 21 seconds")
    counters = RoundCounters()
    cb = StoreCallback(store, "wk", Workload(mod), tvm.target.Target({"kind": "llvm"}), "j",
                       "here", counters)
    from tvm.s_tir.meta_schedule import TaskScheduler

    sched = TaskScheduler.create("round-robin")
    for _ in range(CULPRIT_AFTER - 1):  # retried: not stored, it may have been the phone's fault
        cb.apply(sched, 0, [cand], [built], [lost])
    assert store.record_count("wk") == 0 and counters.device_lost == CULPRIT_AFTER - 1
    cb.apply(sched, 0, [cand], [built], [lost])  # once more: this candidate is the culprit
    [rec] = store.records("wk")
    assert rec.error_class == "culprit" and not rec.valid
    assert f"lost a phone {CULPRIT_AFTER} times" in rec.error_msg
    assert counters.failures["culprit"] == 1 and counters.device_lost == CULPRIT_AFTER - 1
