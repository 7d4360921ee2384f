"""farm status: per-task bars, the measured trial rate and an ETA from it."""

from __future__ import annotations

from farm.client.progress import job_view, render
from farm.core.messages import JobSpec
from farm.store import StoredRecord, TaskState, open_store


def test_eta_comes_from_the_measured_rate():
    store = open_store("memory://")
    job = JobSpec(job_id="j", model="m", device_key="k", target={}, trials_per_task=8,
                  round_trials=4, workload_keys=["a", "b"],
                  task_names={"a": "fused_conv", "b": "reshape"}, weights={"a": 1, "b": 1})
    store.put_job(job)
    store.set_job_status("j", state="running", started_at="1000")
    for i in range(4):
        store.add_record(StoredRecord(workload_key="a", candidate=f"c{i}", record=[],
                                      run_us=10.0 + i, job_id="j"))
    store.set_task_state("j", "a", TaskState(state="tuning", host="farm@h1", best_us=10.0,
                                             message="round 1: 4/4 trials"))
    store.set_task_state("j", "b", TaskState(state="exhausted", message="one schedule"))
    view = job_view(store, job, now=1120.0)  # 4 trials in 2 minutes
    assert view["trials_measured"] == 4 and view["trials_per_min"] == 2.0
    assert view["trials_left"] == 4 and view["eta_s"] == 120.0
    text = render(view)
    assert "ETA 2m00s" in text and "tuning on farm@h1" in text
    assert "[##########..........]    4/8" in text
    assert view["measurements"] == {"measurements": 4, "new": 4, "duplicates": 0, "device_lost": 0}
    assert "phone measurements: 4 (4 new records, 0 measured twice, 0 device lost)" in text
    assert view["tasks"][0]["counts"]["new"] == 4
    store.set_task_state("j", "a", TaskState(state="done"))
    assert job_view(store, job, now=1200.0)["eta_s"] is None  # finished: no ETA
