"""The `farm` command's grammar, and the API beside it: `farm cache` actions are subcommands
with their own help and arguments; `farm submit --json` keeps stdout for the JSON; a flag of
`farm submit` and the `Farm.submit` keyword of that name give the job the same options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import farm
from farm.client import cli, cmd_cache
from farm.pipeline.options import DEFAULT_TRIALS, SubmitOptions

ACTIONS = ["ls", "show", "stats", "export", "import", "rm", "verify", "archive"]


def help_of(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args([*args, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def test_farm_cache_help_lists_every_action(capsys):
    text = help_of(capsys, "cache")
    listed = [line.split()[0] for line in text.splitlines() if line.startswith("    ")
              and line.split()[0] in ACTIONS]
    assert listed == ACTIONS, text
    assert "farm cache ACTION --help" in text


def test_each_cache_action_has_its_own_arguments(capsys):
    show = help_of(capsys, "cache", "show")
    assert "usage: farm cache show" in show and "KEY" in show and "--top" in show
    assert "--retarget" not in show and "--all" not in show and "--source" not in show
    imp = help_of(capsys, "cache", "import")
    assert "DIR" in imp and "--retarget" in imp and "--device-key" in imp
    assert "--all" not in imp and "--tracker" not in imp
    assert "--source" in help_of(capsys, "cache", "rm")
    assert "--tracker" in help_of(capsys, "cache", "verify")


def test_a_flag_of_another_action_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["cache", "show", "wk", "--retarget"])
    assert e.value.code == 2 and "--retarget" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # show needs its key
        cli.build_parser().parse_args(["cache", "show"])


@pytest.mark.parametrize(("argv", "want"), [
    (["cache", "ls", "--json", "--device-key", "k"],
     {"action": "ls", "json": True, "device_key": "k"}),
    (["cache", "show", "wk1"], {"action": "show", "workload_key": "wk1", "top": 5}),
    (["cache", "stats"], {"action": "stats"}),
    (["cache", "export", "d", "--all"], {"action": "export", "folder": "d", "all": True}),
    (["cache", "import", "d", "--device-key", "k", "--retarget"],
     {"action": "import", "folder": "d", "device_key": "k", "retarget": True}),
    (["cache", "rm", "a,b"], {"action": "rm", "workload_keys": "a,b", "source": None}),
    (["cache", "rm", "--source", "job1"], {"action": "rm", "workload_keys": None,
                                           "source": "job1"}),
    (["cache", "verify", "--json", "--tracker", "h:1"],
     {"action": "verify", "json": True, "tracker": "h:1", "workload_keys": None}),
    (["cache", "archive", "--broker", "redis://x"], {"action": "archive",
                                                     "broker": "redis://x"}),
    # the options every action took: before the action too, on any action (read where the
    # action reads them, ignored where it never did)
    (["cache", "--broker", "redis://x", "ls"],
     {"action": "ls", "broker": "redis://x", "json": False, "device_key": None}),
    (["cache", "--json", "--device-key", "k", "ls"],
     {"action": "ls", "json": True, "device_key": "k", "broker": None}),
    (["cache", "--device-key", "k", "export", "d"],
     {"action": "export", "folder": "d", "device_key": "k"}),
    (["cache", "--device-key", "k", "import", "d", "--retarget"],
     {"action": "import", "folder": "d", "device_key": "k", "retarget": True}),
    (["cache", "--json", "verify", "--broker", "redis://x"],
     {"action": "verify", "json": True, "broker": "redis://x", "device_key": None}),
    (["cache", "export", "d", "--json"], {"action": "export", "folder": "d", "json": True}),
    (["cache", "stats", "--device-key", "k"], {"action": "stats", "device_key": "k"}),
    (["cache", "rm", "a", "--json"], {"action": "rm", "workload_keys": "a", "json": True}),
    (["cache", "show", "wk", "--device-key", "k", "--broker", "redis://x"],
     {"action": "show", "workload_key": "wk", "device_key": "k", "broker": "redis://x"}),
    (["cache", "--broker", "redis://x", "archive", "--json"],
     {"action": "archive", "broker": "redis://x", "json": True}),
])
def test_the_old_cache_invocations_still_parse(argv, want):
    args = cli.build_parser().parse_args(argv)
    assert args.func is cmd_cache.cmd_cache
    assert {k: getattr(args, k) for k in want} == want


def test_every_cache_action_is_handled():
    assert set(cmd_cache.ACTIONS) | {"verify"} == set(ACTIONS)


class Submitted:
    """Stands in for the pipeline's `submit`: keeps the options, reports a line."""

    def __init__(self, result: dict) -> None:
        self.result, self.opts = result, None

    def __call__(self, opts, config, say=print, resume=None, view=None) -> dict:
        self.opts = opts
        say("plan: job j1 submitted: 8 trials to measure")
        return self.result


SUMMARY = {"job_id": "j1", "tasks": [], "numerics_ok": True, "latency_us": {}, "out": "o"}


@pytest.fixture
def submitted(monkeypatch):
    fake = Submitted(dict(SUMMARY))
    monkeypatch.setattr("farm.pipeline.job.submit", fake)
    return fake


def test_submit_json_prints_the_summary_on_stdout_and_progress_on_stderr(capsys, submitted):
    assert cli.main(["submit", "m.pt2", "--out", "o", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == SUMMARY
    assert "plan: job j1" in err and "plan:" not in out


def test_submit_no_wait_json_is_the_job_and_its_folder(capsys, submitted):
    submitted.result = {"job_id": "j1", "state": "submitted"}
    assert cli.main(["submit", "m.pt2", "--out", "runs/o", "--no-wait", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["job_id"] == "j1" and got["out"] == "runs/o"


def test_submit_json_keeps_the_exit_code_of_wrong_numerics(capsys, submitted):
    submitted.result = {**SUMMARY, "numerics_ok": False}
    assert cli.main(["submit", "m.pt2", "--out", "o", "--json"]) == 7
    assert json.loads(capsys.readouterr().out)["numerics_ok"] is False


# the same job asked for on the command line and from Python
SAME = [
    ([], {}),
    (["--trials", "100"], {"trials": 100}),
    (["--trials", "100", "--trials-per-task", "8"], {"trials": 100, "trials_per_task": 8}),
    (["--trials-per-task", "8"], {"trials_per_task": 8}),
    (["--early-stop", "3", "--dtype", "int64", "--allow-pickle", "--priority", "high",
      "--input-shape", "1,4", "--tracker", "h:9190", "--wait-for-devices", "5", "--timeout",
      "60", "--force", "--no-wait"],
     {"early_stop_rounds": 3, "dtype": "int64", "allow_pickle": True, "priority": "high",
      "input_shape": "1,4", "tracker": "h:9190", "wait_for_devices_s": 5.0, "timeout_s": 60.0,
      "force": True, "wait": False}),
]


@pytest.mark.parametrize(("flags", "keywords"), SAME)
def test_a_flag_and_the_keyword_of_its_name_ask_the_same(flags, keywords, submitted, capsys,
                                                        monkeypatch, tmp_path):
    monkeypatch.delenv("FARM_BROKER_URL", raising=False)
    monkeypatch.setenv("FARM_HOME", str(tmp_path / "home"))
    cli.main(["submit", "m.pt2", "--out", "o", "--json", *flags])
    from_cli = submitted.opts
    farm.Farm().submit("m.pt2", out="o", **keywords)
    assert submitted.opts == from_cli
    if not flags:  # the defaults are the options' own
        assert from_cli == SubmitOptions(model=Path("m.pt2"), out=Path("o"))
        assert from_cli.trials_per_task == DEFAULT_TRIALS


def test_a_job_budget_alone_lets_a_task_take_all_of_it(submitted, tmp_path, monkeypatch):
    monkeypatch.setenv("FARM_HOME", str(tmp_path / "home"))
    farm.Farm().submit("m.pt2", out="o", trials=100)
    assert (submitted.opts.trials_per_task, submitted.opts.trials_budget) == (100, 100)


def test_a_job_budget_below_one_is_refused_by_both(capsys, submitted, tmp_path, monkeypatch):
    monkeypatch.setenv("FARM_HOME", str(tmp_path / "home"))
    assert cli.main(["submit", "m.pt2", "--out", "o", "--trials", "0"]) == 2
    assert "--trials: must be a whole number >= 1" in capsys.readouterr().err
    for bad in (-1, 2.5, True):
        with pytest.raises(farm.UsageError, match="--trials: must be a whole number >= 1"):
            farm.Farm().submit("m.pt2", out="o", trials=bad)
    assert submitted.opts is None


def test_the_apis_trials_0_is_no_job_budget(submitted, tmp_path, monkeypatch):
    """`trials=0`, the API's documented default once, still means no job budget (None);
    the command's `--trials 0` is refused (above)."""
    monkeypatch.setenv("FARM_HOME", str(tmp_path / "home"))
    farm.Farm().submit("m.pt2", out="o", trials=0, trials_per_task=8)
    assert (submitted.opts.trials_per_task, submitted.opts.trials_budget) == (8, 0)
    farm.Farm().submit("m.pt2", out="o", trials=0)
    assert submitted.opts == SubmitOptions(model=Path("m.pt2"), out=Path("o"))


def test_round_trials_and_device_key_are_the_jobs_config(monkeypatch, tmp_path):
    monkeypatch.setenv("FARM_HOME", str(tmp_path / "home"))
    seen = {}

    def fake(opts, config, say=print, resume=None, view=None):
        seen.update(round_trials=config.round_trials, device_key=config.device_key)
        return {"job_id": "j1", "state": "submitted"}

    monkeypatch.setattr("farm.pipeline.job.submit", fake)
    lab = farm.Farm(settings={"round_trials": 4})
    lab.submit("m.pt2", out="o", wait=False)
    assert seen == {"round_trials": 4, "device_key": "cpu-local"}
    lab.submit("m.pt2", out="o", wait=False, round_trials=2, device_key="pixel7")
    assert seen == {"round_trials": 2, "device_key": "pixel7"}
    with pytest.raises(farm.UsageError, match="round_trials"):
        lab.submit("m.pt2", out="o", round_trials=0)


def test_farm_exports_what_users_need():
    from farm.client import api, jobs
    from farm.core import errors

    assert (farm.Farm, farm.Job, farm.Cache) == (api.Farm, api.Job, api.Cache)
    assert (farm.Progress, farm.TaskProgress) == (jobs.Progress, jobs.TaskProgress)
    assert farm.SubmitOptions is SubmitOptions
    assert farm.FarmError is errors.FarmError and farm.UsageError is errors.UsageError
    assert all(hasattr(farm, name) for name in farm.__all__)
    with pytest.raises(AttributeError):
        _ = farm.Nothing
