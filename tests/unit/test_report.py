"""report.html: plots with axes and whole labels, each task's curve over this job's trials
only (log latency axis), the whole model's estimated latency vs trials, GFLOPS per task, each
task's store records, and two runs side by side (`farm report OUT --against OUT2`)."""

import re
from html.parser import HTMLParser

from farm.core.messages import TuneTask
from farm.pipeline.curves import model_curve
from farm.pipeline.report import BLUE, GREEN, RED, job_trials, log_ticks, render, svg_curve
from farm.pipeline.summary import gflops
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
    svg = svg_curve([(1, 40.0), (2, 30.0), (5, 20.0)], failed=[3, 4])
    assert "trials of this job" in svg and "best us (log)" in svg  # axis titles
    assert ">1<" in svg and ">5<" in svg and ">40<" in svg and ">20<" in svg  # tick labels
    assert svg.count("<line ") == 2 + 2  # both axes, and a mark per failed trial
    assert svg.count('class="failed"') == 2 and "2 failed" in svg


def path_points(svg: str) -> list[tuple[float, float]]:
    path = re.search(r'<path d="([^"]+)"', svg)
    assert path is not None, svg
    return [(float(x), float(y)) for x, y in re.findall(r"[ML]([-0-9.]+),([-0-9.]+)", path[1])]


def test_the_latency_axis_is_log_scale():
    svg = svg_curve([(1, 1000.0), (2, 100.0), (3, 10.0)])
    ys = [y for _, y in path_points(svg)]
    assert ys[0] < ys[1] < ys[2]  # faster is lower
    assert abs((ys[1] - ys[0]) - (ys[2] - ys[1])) < 0.5  # each tenth as far down: log
    assert ">10<" in svg and ">100<" in svg and ">1e+03<" in svg  # the decades
    assert log_ticks(1.0, 1e8) == [10.0 ** k for k in range(9)]
    assert log_ticks(10.0, 100.0) == [10.0, 20.0, 50.0, 100.0]


def rec(wk: str, candidate: str, us: float | None, job: str, at: float) -> StoredRecord:
    return StoredRecord(workload_key=wk, candidate=candidate, record=[{}, [1.0]], run_us=us,
                        error_class=None if us is not None else "runtime", job_id=job,
                        measured_at=at)


def test_a_tasks_curve_counts_only_this_jobs_trials(tmp_path):
    """Before, the curve ran over every stored record of the workload: another job's too."""
    store = open_store("memory://", hot_records=2, archive=str(tmp_path / "archive"))
    for i in range(6):  # an earlier job's, faster: not this job's trials
        store.add_record(rec("wk-conv", f"old{i}", 5.0 + i, "j-old", 100.0 + i))
    for i, us in enumerate([20.0, None, 15.0, 18.0]):  # this job's: one failed
        store.add_record(rec("wk-conv", f"new{i}", us, "j-new", 200.0 + i))
    assert store.job_measured("j-new") == {"wk-conv": 4}
    assert len(store.records("wk-conv")) < 10  # most are in the archive only
    new = summary("j-new", 50.0, {"conv": 5.0})
    new["tasks"][0].update(trials_measured=4, trials_from_store=6)
    (trials,) = job_trials(new, store)
    assert [us for _, us in trials.trials] == [20.0, None, 15.0, 18.0]  # the job's, in order
    assert trials.other_best == 5.0
    page = render(new, store)
    svg = page[page.index("<td><svg class=\"curve\""):]
    svg = svg[:svg.index("</svg>") + 6]
    assert [x for x, _ in path_points(svg)] == sorted({x for x, _ in path_points(svg)})
    assert len(path_points(svg)) == 4  # trials 1 to 4 of this job, not 10
    assert ">4<" in svg and ">10<" not in svg  # the x axis ends at this job's 4th trial
    assert "best 15.0 us after 4 trials (first valid: 20.0 us), 1 failed" in svg
    assert svg.count('class="failed"') == 1
    assert "the best applied, 5.0 us, was measured before this job" in page


def test_the_model_curve_falls_to_the_sum_of_weight_times_best():
    store = open_store("memory://")
    for r in [rec("wk-a", "a-old", 50.0, "j-old", 10.0), rec("wk-b", "b-old", 12.0, "j-old", 11.0),
              rec("wk-a", "a1", 40.0, "j", 20.0), rec("wk-b", "b1", None, "j", 21.0),
              rec("wk-a", "a2", 30.0, "j", 22.0), rec("wk-b", "b2", 10.0, "j", 23.0),
              rec("wk-b", "b3", 8.0, "j", 24.0), rec("wk-a", "a3", 35.0, "j", 25.0),
              rec("wk-a", "a-later", 1.0, "j-later", 99.0)]:  # after the job ended
        store.add_record(r)
    store.set_job_status("j", state="finalized", finalized_at="30")
    s = summary("j", 50.0, {"a": 30.0, "b": 8.0})
    s["tasks"][1]["weight"] = 2
    trials = job_trials(s, store)
    points = model_curve(trials)
    assert [x for x, _ in points] == [1, 2, 3, 4, 5, 6]  # every trial of the job, in time order
    ys = [y for _, y in points]
    assert all(b <= a for a, b in zip(ys, ys[1:], strict=False))  # non-increasing
    assert ys[0] == 40.0 + 2 * 12.0  # a's first trial; b from the store's best of other jobs
    assert ys[-1] == sum(t["weight"] * t["best_us"] for t in s["tasks"]) == 46.0
    page = render(s, store)
    assert 'class="model-curve"' in page and "estimated 46.0 us after 6 trials" in page
    assert page.count('class="curve"') == 2  # one per task: the model's is not counted as one
    # b had no run time before its 4th trial anywhere: the estimate starts there
    store.remove_records("wk-b", ["b-old"])
    assert [x for x, _ in model_curve(job_trials(s, store))] == [4, 5, 6]


def test_gflops_shown_equals_flops_over_the_best_latency():
    store = open_store("memory://")
    s = summary("j", 50.0, {"conv": 12.5, "dense": 4.0, "relu": 2.0})
    conv, dense, relu = s["tasks"]
    conv.update(flop=3.6e6, gflops=gflops(3.6e6, 12.5))
    relu.update(flop=0.0, gflops=gflops(0.0, 2.0))  # TVM could not count its FLOPs
    # dense: a summary written before it had GFLOPS: from the FLOPs the store keeps
    store.put_workload(TuneTask(name="dense", workload_key="wk-dense", weight=1, mod_json="",
                                target={}, device_key="cpu-local", flop=5e4))
    assert gflops(2e9, 1000.0) == 2000.0  # 2e9 FLOPs in 1 ms
    page = render(s, store)
    shown = re.findall(r"<td class=gflops>([^<]*)</td>", page)
    assert shown == ["288", "12.5", "-"]  # 3.6e6 / 12.5e-6 s; 5e4 / 4e-6 s; unknown


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


def test_the_curves_render_in_a_browser_without_network(tmp_path):
    """The page in a real headless Chromium (network refused): the tasks' curves, the whole
    model's curve and the failed trials' marks are drawn, not just written."""
    from tests.helpers import png_pixels, screenshot

    store = open_store("memory://")
    for i, (wk, us) in enumerate([("wk-a", 40.0), ("wk-b", None), ("wk-a", 30.0), ("wk-b", 10.0),
                                  ("wk-b", 8.0), ("wk-a", 35.0), ("wk-a", 28.0)]):
        store.add_record(rec(wk, f"c{i}", us, "j", 20.0 + i))
    s = summary("j", 50.0, {"a": 28.0, "b": 8.0})
    s["tasks"][0]["trials_measured"], s["tasks"][1]["trials_measured"] = 4, 3
    page = tmp_path / "report.html"
    page.write_text(render(s, store))
    png = tmp_path / "report.png"
    screenshot(page, png, width=1400, height=1600)
    pixels = png_pixels(png)

    def count(rgb: str, tol: int = 40) -> int:
        want = tuple(int(rgb[i:i + 2], 16) for i in (1, 3, 5))
        return sum(1 for p in pixels if all(abs(a - b) < tol for a, b in zip(p, want, strict=True)))

    assert count(BLUE) >= 2 * 150, count(BLUE)  # both tasks' curves
    assert count(GREEN) >= 150, count(GREEN)  # the whole model's
    assert count(RED, tol=60) >= 2, count(RED)  # b's failed first trial, under its axis


def test_the_flops_of_a_task_are_counted():
    """GFLOPS need the FLOPs extract counts; on TVM 0.27 its estimator had moved
    (tvm.s_tir.analysis) and every task counted 0, so no GFLOPS were shown."""
    import tvm
    from tvm import te

    from farm.pipeline.extract import _flop

    a, b = te.placeholder((4, 64), name="a"), te.placeholder((64, 32), name="b")
    k = te.reduce_axis((0, 64), name="k")
    c = te.compute((4, 32), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b, c])})
    assert _flop(mod) == 2 * 4 * 64 * 32  # a multiply and an add per (i, j, k)
