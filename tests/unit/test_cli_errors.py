"""Bad input: one clear line naming the subject, a named exit code, no traceback, nothing in --out."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from farm import cli
from farm.errors import EXIT_CODES
from farm.services import free_port


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
    code, err = farm(capsys, "worker", "--tracker", f"127.0.0.1:{port}", "--broker", redis_url)
    assert code == EXIT_CODES["service"]
    assert_one_line(err, f"127.0.0.1:{port}", "query_rpc_tracker")


def test_embedded_farm_refuses_a_foreign_profile(capsys, tmp_path, models):
    code, err, out = submit(capsys, tmp_path, models["small"], "--device-key", "android-arm64")
    assert code == EXIT_CODES["usage"]
    assert_one_line(err, "android-arm64", "aarch64", "FARM_BROKER_URL")
    assert not out.exists()
