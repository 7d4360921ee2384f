"""report.html: plots with axes and whole labels, each task's store records, and two runs side
by side (`farm report OUT --against OUT2`)."""

from html.parser import HTMLParser

from farm.pipeline.report import render, svg_curve
from farm.store import StoredRecord, open_store

LONG = "fused_conv2d_add_relu_with_a_name_longer_than_any_fixed_width_cut"


def summary(job: str, tuned: float, best: dict[str, float], wall: float = 60.0) -> dict:
    return {
        "job_id": job, "model": "net", "device_key": "cpu-local", "target": {"kind": "llvm"},
        "trials_per_task": 8, "wall_s": wall, "threads": 1, "measured_on": "cpu",
        "latency_us": {"torch": 100.0, "untuned": 300.0, "tuned": tuned},
        "speedup": {"tuned_vs_untuned": 300.0 / tuned, "tuned_vs_torch": 100.0 / tuned},
        "numerics_ok": True, "max_abs_err": 1e-6,
        "schedules": {"from_log": ["main"], "fallback": {}},
        "tasks": [{"name": name, "workload_key": f"wk-{name}", "weight": 1, "trials_measured": 8,
                   "trials_from_store": 0, "best_us": us, "failures": {}, "device_lost": 0,
                   "state": "done", "measure_s": 3.0} for name, us in best.items()],
    }


def test_the_curve_has_axes_and_labels():
    svg = svg_curve([(1, 40.0), (2, 30.0), (5, 20.0)])
    assert "trials measured" in svg and "best us" in svg  # axis titles
    assert ">1<" in svg and ">5<" in svg and ">40.0<" in svg and ">20.0<" in svg  # tick labels
    assert svg.count("<line ") == 2  # both axes


def test_two_runs_side_by_side_with_whole_task_names():
    store = open_store("memory://")
    store.add_record(StoredRecord(workload_key=f"wk-{LONG}", candidate="c0ffee", record=[{}, [1.0]],
                                  run_us=12.5, job_id="j-new", host="farm@h1"))
    new = summary("j-new", 50.0, {LONG: 12.5, "dense": 4.0})
    old = summary("j-old", 80.0, {LONG: 25.0, "other": 9.0}, wall=120.0)
    page = render(new, store, against=old)
    HTMLParser().feed(page)
    assert page.count(LONG) >= 3  # the table, the share bars and the comparison: never cut
    assert 'id="compare"' in page and "Against job j-old" in page
    assert "<td>50.0</td><td>80.0</td><td>0.62</td>" in page  # the model's tuned latency
    assert "<td>12.5</td><td>25.0</td><td>0.50</td>" in page  # the shared task, its ratio
    assert "not in that run" in page  # "dense" was not a task of the other run
    assert f"farm cache show wk-{LONG}" in page and "c0ffee" in page
    assert 'id="compare"' not in render(new, store)  # no comparison unless asked
