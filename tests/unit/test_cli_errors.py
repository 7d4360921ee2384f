"""Bad input: one clear line naming the subject, a named exit code, no traceback, nothing in --out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from farm.client import cli
from farm.core.errors import EXIT_CODES, ServiceError, StoreError
from farm.local.services import free_port
from farm.pipeline.options import SubmitOptions
from farm.pipeline.preflight import preflight


@pytest.fixture(autouse=True)
def no_lab_farm(monkeypatch, tmp_path):
    monkeypatch.delenv("FARM_BROKER_URL", raising=False)
    monkeypatch.setenv("FARM_HOME", str(tmp_path / "home"))


def farm(capsys, *args: str) -> tuple[int, str]:
    code = cli.main(list(args))
    err = capsys.readouterr().err
    return code, err


def assert_one_line(err: str, *needles: str) -> None:
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("farm: error:")]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]


class Identity(torch.nn.Module):
    def forward(self, x):
        return x


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Det(torch.nn.Module):
    def forward(self, x):
        return torch.linalg.det(x)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bad-models")
    x = torch.randn(2, 8)
    small = Small().eval()
    torch.export.save(torch.export.export(small, (x,)), d / "small.pt2")
    torch.jit.save(torch.jit.trace(small, x), d / "small.pt")
    torch.save(small, d / "pickled.pt")
    torch.export.save(torch.export.export(Identity(), (x,)), d / "identity.pt2")
    torch.export.save(torch.export.export(Det(), (torch.randn(4, 4),)), d / "det.pt2")
    data = (d / "small.pt2").read_bytes()
    (d / "truncated.pt2").write_bytes(data[: len(data) // 2])
    (d / "notes.txt").write_text("not a model\n")
    return {p.stem if p.suffix != ".pt" else p.name: p for p in d.iterdir()}


def submit(capsys, tmp_path, model: Path, *extra: str) -> tuple[int, str, Path]:
    out = tmp_path / "out"
    code, err = farm(capsys, "submit", str(model), "--out", str(out), "--trials-per-task", "2",
                     *extra)
    return code, err, out


def test_missing_file(capsys, tmp_path):
    code, err, out = submit(capsys, tmp_path, tmp_path / "nope.pt2")
    assert code == EXIT_CODES["ingest"]
    assert_one_line(err, "nope.pt2", "no such file")
    assert not out.exists()


def test_not_a_model(capsys, tmp_path, models):
    code, err, _ = submit(capsys, tmp_path, models["notes"])
    assert code == EXIT_CODES["ingest"]
    assert_one_line(err, "notes.txt", "not a model")


def test_truncated_file(capsys, tmp_path, models):
    code, err, _ = submit(capsys, tmp_path, models["truncated"])
    assert code == EXIT_CODES["ingest"]
    assert_one_line(err, "truncated.pt2")


def test_torchscript_needs_input_shape(capsys, tmp_path, models):
    code, err, _ = submit(capsys, tmp_path, models["small.pt"])
    assert code == EXIT_CODES["usage"]
    assert_one_line(err, "small.pt", "--input-shape")


def test_wrong_rank(capsys, tmp_path, models):
    code, err, _ = submit(capsys, tmp_path, models["small.pt"], "--input-shape", "2,8,3")
    assert code == EXIT_CODES["usage"]
    assert_one_line(err, "small.pt", "[2, 8, 3]")
    code, err, _ = submit(capsys, tmp_path, models["small"], "--input-shape", "2,8,1")
    assert code == EXIT_CODES["usage"]
    assert_one_line(err, "rank 2")


def test_pickle_needs_allow_pickle(capsys, tmp_path, models):
    code, err, _ = submit(capsys, tmp_path, models["pickled.pt"], "--input-shape", "2,8")
    assert code == EXIT_CODES["usage"]
    assert_one_line(err, "pickled.pt", "--allow-pickle", "runs code")


def test_no_tunable_operator(capsys, tmp_path, models):
    code, err, _ = submit(capsys, tmp_path, models["identity"])
    assert code == EXIT_CODES["extract"]
    assert_one_line(err, "identity", "no tunable operator")


def test_unconvertible_operator_is_named(capsys, tmp_path, models):
    code, err, _ = submit(capsys, tmp_path, models["det"])
    assert code == EXIT_CODES["extract"]
    assert_one_line(err, "det.pt2", "_linalg_det")


@pytest.mark.parametrize("trials", ["0", "-3"])
def test_bad_trial_budget(capsys, tmp_path, models, trials):
    out = tmp_path / "out"
    code, err = farm(capsys, "submit", str(models["small"]), "--out", str(out),
                     "--trials-per-task", trials)
    assert code == EXIT_CODES["usage"]
    assert_one_line(err, "--trials-per-task")


def test_out_not_empty(capsys, tmp_path, models):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, err = farm(capsys, "submit", str(models["small"]), "--out", str(out))
    assert code == EXIT_CODES["usage"]
    assert_one_line(err, str(out), "--force")
    assert (out / "keep.txt").read_text() == "mine"


def test_redis_unreachable_names_the_address(capsys, tmp_path, models, monkeypatch):
    port = free_port()
    monkeypatch.setenv("FARM_BROKER_URL", f"redis://127.0.0.1:{port}/0")
    code, err, out = submit(capsys, tmp_path, models["small"])
    assert code == EXIT_CODES["service"]
    assert_one_line(err, f"127.0.0.1:{port}")
    assert not out.exists()


def test_tracker_unreachable_names_the_address(capsys, redis_url):
    port = free_port()
    path_before = os.environ.get("PYTHONPATH")
    code, err = farm(capsys, "worker", "--tracker", f"127.0.0.1:{port}", "--broker", redis_url)
    assert code == EXIT_CODES["service"]
    assert_one_line(err, f"127.0.0.1:{port}", "query_rpc_tracker")
    # a refused worker leaves the caller as it was: torch is hidden only from a running
    # worker (farm/devices/lean.py); leaking it broke every later `farm submit` of the run
    assert os.environ.get("PYTHONPATH") == path_before


def test_embedded_farm_refuses_a_foreign_profile(capsys, tmp_path, models):
    code, err, out = submit(capsys, tmp_path, models["small"], "--device-key", "android-arm64")
    assert code == EXIT_CODES["usage"]
    assert_one_line(err, "android-arm64", "aarch64", "FARM_BROKER_URL")
    assert not out.exists()


# --- the checks before anything starts refuse bad input only: good input passes them -------
def opts(model: Path, out: Path, **changes) -> SubmitOptions:
    return SubmitOptions(model=model, out=out, **changes)


def test_preflight_passes_good_input_of_every_kind(tmp_path, models):
    from farm.core.config import load_config

    toml = tmp_path / "farm.toml"
    toml.write_text('[profiles.pixel7]\ntarget = { kind = "llvm" }\nthreads = 2\n')
    said: list[str] = []
    for key in ("cpu-local", "arm64-sim", "pixel7"):  # built in, emulated, declared in farm.toml
        config = load_config({"device_key": key}, env={"FARM_HOME": str(tmp_path / "home")},
                             config_file=toml)
        preflight(opts(models["small"], tmp_path / "new" / "deeper" / "out"), config, said.append)
    config = load_config({}, env={"FARM_HOME": str(tmp_path / "home")}, config_file=toml)
    preflight(opts(models["small.pt"], tmp_path / "o", input_shape="2,8", dtype="float16",
                   timeout_s=60.0, trials_budget=10, early_stop_rounds=2), config, said.append)
    preflight(opts(models["pickled.pt"], tmp_path / "o", input_shape="2x8", allow_pickle=True),
              config, said.append)
    (tmp_path / "empty").mkdir()
    preflight(opts(models["small"], tmp_path / "empty"), config, said.append)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "old.txt").write_text("old")
    preflight(opts(models["small"], tmp_path / "full", force=True), config, said.append)
    assert not said  # nothing to report, and nothing made or started:
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "farm.toml", "full"]


def test_a_lab_farm_is_asked_for_its_keys_before_the_model_is_read(tmp_path, models,
                                                                  clean_redis):
    from farm.core.config import load_config
    from farm.store import hosts, open_store

    config = load_config({"broker_url": clean_redis, "device_key": "lab-b"},
                         env={"FARM_HOME": str(tmp_path / "home")})
    said: list[str] = []
    with pytest.raises(ServiceError, match="no worker host has phones of key 'lab-b'"):
        preflight(opts(models["small"], tmp_path / "out"), config, said.append)
    store = open_store(clean_redis)
    store.publish_host(hosts.HostBeat(name="farm@h1", tracker="127.0.0.1:9190",
                                      phones={"lab-b": {"total": 1, "free": 1, "busy": 0}}), 30)
    store.close()
    # a key the farm's hosts serve is known there, even without a profile here: said so
    preflight(opts(models["small"], tmp_path / "out"), config, said.append)
    assert len(said) == 1 and "lab-b has no profile here" in said[0], said
    assert not (tmp_path / "out").exists() and not (tmp_path / "home").exists()


@pytest.mark.parametrize("shape", ["1,x,3", "1,,3", "2,8,", "0,8", ""])
def test_a_bad_shape_is_refused_before_the_farm_starts(capsys, tmp_path, models, shape):
    code, err, out = submit(capsys, tmp_path, models["small.pt"], "--input-shape", shape)
    assert code == EXIT_CODES["usage"]
    assert_one_line(err, "--input-shape")
    assert not out.exists() and not (tmp_path / "home").exists()


def test_an_error_quoting_many_lines_is_still_one_line(capsys, monkeypatch):
    def boom(_args):
        raise StoreError("cannot read it:\nTraceback (most recent call last):\n  File x\nE",
                         subject="db", hint="check it")

    monkeypatch.setattr(cli, "cmd_status", boom)
    code, err = farm(capsys, "status")
    assert code == EXIT_CODES["store"]
    assert err.splitlines() == ["farm: error: db: cannot read it: [3 more lines with --debug] "
                                "(check it)"]


def test_resume_takes_nothing_from_the_store_that_widens_the_users_request(tmp_path):
    """A store others can write must not make `farm resume`/`wait` load a pickle, nor
    replace a folder the farm did not write."""
    from farm.core.errors import UsageError
    from farm.core.messages import JobSpec
    from farm.pipeline.options import SubmitOptions
    from farm.pipeline.preflight import OUT_MARKER, is_result

    victim = tmp_path / "home-of-the-user"
    victim.mkdir()
    (victim / "thesis.tex").write_text("years of work")
    job = JobSpec(job_id="j", model="m", device_key="cpu-local", target={"kind": "llvm"},
                  trials_per_task=2, round_trials=2, workload_keys=[], task_names={},
                  weights={}, options={"model": str(tmp_path / "m.pt"), "out": str(victim),
                                       "allow_pickle": True})
    opts = SubmitOptions.from_job(job)
    assert opts.allow_pickle is False and opts.out == victim
    assert not is_result(victim)  # so resume does not --force it: check_out_dir refuses
    result = tmp_path / "out"
    result.mkdir()
    (result / "summary.json").write_text("{}")
    (result / OUT_MARKER).write_text("j\n")
    assert is_result(result) and is_result(tmp_path / "missing")
    stored = job.to_json()
    stored["options"] = {"model": "m.pt2"}
    with pytest.raises(UsageError, match="--out"):
        SubmitOptions.from_job(JobSpec.from_json(stored))


def test_farm_version_names_the_tvm_its_phones_must_run(capsys):
    from importlib import metadata

    from farm.client.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("tunefarm ") and f"apache-tvm {metadata.version('apache-tvm')}" in out
