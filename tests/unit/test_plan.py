from farm.messages import TuneTask
from farm.plan import plan
from farm.store import StoredRecord, open_store


def task(wk: str) -> TuneTask:
    return TuneTask(name=wk, workload_key=wk, weight=1, mod_json="{}", target={"kind": "llvm"},
                    device_key="k")


def test_plan_asks_only_for_missing_trials():
    store = open_store("memory://")
    for i in range(5):
        store.add_record(StoredRecord(workload_key="a", candidate=f"c{i}", record=[{}, [1.0]],
                                      run_us=1.0 + i))
    store.mark_exhausted("b", 1)
    plans = {p.task.workload_key: p for p in plan([task("a"), task("b"), task("c")], store, 8, 2)}
    assert (plans["a"].in_store, plans["a"].needed, plans["a"].cached) == (5, 3, False)
    assert plans["b"].cached and plans["b"].needed == 0
    assert plans["c"].needed == 8 and plans["c"].max_rounds >= 4
    assert plan([task("a")], store, 5, 2)[0].cached
