"""A job budget (`--trials N`): every task gets a first round, the planner spends the rest where
it pays most, and the job stops at its budget."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_farm

pytestmark = pytest.mark.integration


def test_job_budget_is_spent_and_respected(example_models, tmp_path):
    out = tmp_path / "out"
    proc = run_farm(["submit", str(example_models / "resnet.pt2"), "--trials", "12",
                     "--round-trials", "2", "--early-stop", "3", "--out", str(out),
                     "--timeout", "1500"], tmp_path / "home")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    tasks = summary["tasks"]
    measured = sum(t["trials_measured"] for t in tasks)
    # rounds get trials from the budget before they are sent: never more than the budget
    assert 9 <= measured <= 12, [(t["name"], t["trials_measured"]) for t in tasks]
    assert all(t["trials_measured"] >= 1 for t in tasks)  # every task got a first round
    assert all(t["best_us"] is not None for t in tasks)
    assert all(t["state"] in ("done", "exhausted") for t in tasks)
    assert summary["numerics_ok"]
