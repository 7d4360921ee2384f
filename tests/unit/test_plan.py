from farm.core.messages import TuneTask
from farm.jobs.plan import plan


def task(wk: str) -> TuneTask:
    return TuneTask(name=wk, workload_key=wk, weight=1, mod_json="{}", target={"kind": "llvm"},
                    device_key="k")


def test_plan_asks_only_for_missing_trials():
    """The planner is pure: told the records in the store and the exhausted workloads."""
    tasks = [task("a"), task("b"), task("c")]
    plans = {p.task.workload_key: p for p in plan(tasks, {"a": 5, "b": 1}, {"b"}, 8, 2)}
    assert (plans["a"].in_store, plans["a"].needed, plans["a"].cached) == (5, 3, False)
    assert plans["b"].cached and plans["b"].needed == 0
    assert plans["c"].needed == 8 and plans["c"].max_rounds >= 4
    assert plan([task("a")], {"a": 5}, set(), 5, 2)[0].cached


def test_stopped_early():
    from farm.jobs.plan import stopped_early

    assert not stopped_early([10.0, 9.0], 2)
    assert stopped_early([10.0, 9.0, 9.0, 9.0], 2)
    assert not stopped_early([10.0, 9.0, 9.0, 8.0], 2)
    assert not stopped_early([10.0, 5.0, 5.0], 0)


def test_next_task_prefers_weighty_slow_improving_tasks():
    from farm.jobs.plan import next_task

    ready = {"small": (1, [10.0, 9.9]), "heavy": (4, [100.0, 50.0]), "failed": (9, [])}
    assert next_task(ready) == "heavy"
    assert next_task({"a": (1, [5.0, 5.0]), "b": (1, [50.0, 50.0])}) == "b"
    assert next_task({}) is None


def test_a_job_budget_is_split_over_the_tasks_that_need_trials():
    from farm.jobs.plan import split_budget

    plans = plan([task("a"), task("b"), task("c")], {"a": 6}, set(), 8, 4)  # "a" holds 6 of 8
    same, budget, first = split_budget(plans, 0, 8, 4)  # no budget: per-task rounds
    assert (same, budget, first) == (plans, 0, 4)
    split, budget, first = split_budget(plans, 10, 8, 4)
    assert budget == 4  # 10 asked, 6 in the store already
    assert first == 1  # 4 trials over 3 tasks that need some: 1 each to start
    assert [p.needed for p in split] == [2, 4, 4] and all(p.max_rounds == 6 for p in split)
    covered, budget, _ = split_budget(plans, 6, 8, 4)  # the store holds the whole budget
    assert budget == 0 and all(p.cached for p in covered)


def test_a_round_that_found_no_candidate_at_all_says_so():
    """An operator MetaSchedule proposes nothing for (adaptive pooling with uneven windows, seen
    on an unseen model) was reported as "search space exhausted after 0 distinct candidates"."""
    from farm.core.messages import RoundRequest, RoundResult
    from farm.jobs.plan import AfterRound, verdict

    req = RoundRequest(job_id="j", workload_key="w", task_name="pool", round_index=0, trials=2,
                       target_trials=2, max_rounds=4, device_key="k")
    found_none = RoundResult(job_id="j", workload_key="w", round_index=0, host="h", measured=0,
                             valid=0, requested=2)
    step = verdict(req, found_none, AfterRound(count=0))
    assert step is not None and step.exhausted
    assert (step.state, step.message) == ("exhausted", "MetaSchedule proposed no candidate for "
                                                       "it (TVM's default schedule is used)")
    found_one = RoundResult(job_id="j", workload_key="w", round_index=0, host="h", measured=1,
                            valid=1, requested=2)
    step = verdict(req, found_one, AfterRound(count=1))
    assert step is not None and step.message == "search space exhausted after 1 distinct candidates"
    skipped = RoundResult(job_id="j", workload_key="w", round_index=0, host="h", measured=1,
                          valid=1, requested=2, skipped_stored=1)  # the store had the other
    assert verdict(req, skipped, AfterRound(count=1)) is None  # not exhausted: next round
