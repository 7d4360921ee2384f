"""A .pt2 is data; one crafted to carry a pickle is refused and its payload never runs
(farm/pipeline/archive.py: the archive read without torch, then torch held to tensors)."""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import pytest

from farm.core.errors import UsageError
from tests.helpers import run_farm


class Payload:
    """Unpickling it runs a shell command that leaves a file: the attack."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plain(tmp_path: Path) -> Path:
    import torch

    path = tmp_path / "fc.pt2"
    torch.export.save(torch.export.export(torch.nn.Linear(4, 2).eval(), (torch.randn(1, 4),)),
                      path)
    return path


def _rewrite(src: Path, dst: Path, change) -> Path:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = change(info.filename, zin.read(info.filename))
            zout.writestr(info.filename, data)
    return dst


def _pickled(obj) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_a_pickled_weight_is_refused_and_not_run(tmp_path):
    marker = tmp_path / "ran"

    def change(name: str, data: bytes) -> bytes:
        if name.endswith("model_weights_config.json"):
            config = json.loads(data)
            config["config"]["weight"]["use_pickle"] = True
            return json.dumps(config).encode()
        if name.endswith("data/weights/weight_0"):
            return _pickled(Payload(marker))
        return data

    evil = _rewrite(_plain(tmp_path), tmp_path / "evil.pt2", change)
    proc = run_farm(["submit", str(evil), "--out", str(tmp_path / "out")], tmp_path / "home",
                    timeout_s=300)
    assert proc.returncode == UsageError.exit_code, proc.stderr
    assert "weight weight (pickled)" in proc.stderr and "--allow-pickle" in proc.stderr
    assert not marker.exists()


def test_a_pickle_the_configs_do_not_name_is_refused_while_loading(tmp_path):
    """The sample inputs are always a torch.save pickle, and torch falls back to an unsafe
    load when a weights-only one fails: the archive's configs say nothing of it."""
    from farm.pipeline import ingest

    marker = tmp_path / "ran"

    def change(name: str, data: bytes) -> bytes:
        if name.endswith("data/sample_inputs/model.pt"):
            return _pickled(((Payload(marker),), {}))
        return data

    evil = _rewrite(_plain(tmp_path), tmp_path / "evil.pt2", change)
    with pytest.raises(UsageError, match="not plain tensors"):
        ingest.load(evil, None, "float32", allow_pickle=False)
    assert not marker.exists()


def test_plain_archives_load_and_compiled_code_is_named(tmp_path):
    from farm.pipeline.archive import pickled_payloads

    plain = _plain(tmp_path)
    assert pickled_payloads(plain) == []
    aoti = _rewrite(plain, tmp_path / "aoti.pt2", lambda n, d: d)
    with zipfile.ZipFile(aoti, "a") as z:
        z.writestr("fc/data/aotinductor/model/model.so", b"\x7fELF")
    assert pickled_payloads(aoti) == ["data/aotinductor/model/model.so (compiled AOTInductor code)"]
