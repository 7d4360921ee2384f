import pytest

from farm.core.errors import StoreError
from farm.core.messages import JobSpec, RoundRequest, RoundResult, TuneTask
from farm.store import StoredRecord, TaskState

SAMPLES = [
    TuneTask(name="conv", workload_key="abc", weight=2, mod_json="{}", target={"kind": "llvm"},
             device_key="cpu-local", flop=1.5),
    RoundRequest(job_id="j", workload_key="abc", task_name="conv", round_index=1, trials=8,
                 target_trials=32, max_rounds=6, device_key="cpu-local", model="m"),
    RoundResult(job_id="j", workload_key="abc", round_index=0, host="h", measured=3, valid=2,
                failures={"build": 1}, device_lost=1, best_us=12.5, wall_s=3.0),
    JobSpec(job_id="j", model="m", device_key="k", target={"kind": "llvm"}, trials_per_task=4,
            round_trials=4, workload_keys=["a"], task_names={"a": "x"}, weights={"a": 1}),
    StoredRecord(workload_key="abc", candidate="c", record=[[], [1e-5], {}, []], run_us=10.0),
    TaskState(state="done", rounds=2, failures={"timeout": 1}),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg):
    assert type(msg).loads(msg.dumps()) == msg


def test_unknown_schema_is_refused_with_its_subject():
    data = SAMPLES[1].to_json()
    data["schema"] = 99
    with pytest.raises(StoreError, match="round request.*schema version 99"):
        RoundRequest.from_json(data)


def test_garbage_is_a_store_error_not_a_crash():
    with pytest.raises(StoreError, match="not JSON"):
        RoundRequest.loads("{nope")
    with pytest.raises(StoreError, match="malformed"):
        RoundRequest.from_json({"schema": 1, "job_id": "j"})
