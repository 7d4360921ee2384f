"""A .pt2 is data; one crafted to carry a pickle is refused and its payload never runs
(farm/pipeline/modelfile.py: the .pt2 zip read without torch, then torch held to tensors)."""

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
    load when a weights-only one fails: the zip's configs say nothing of it."""
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


def test_plain_zips_load_and_compiled_code_is_named(tmp_path):
    from farm.pipeline.modelfile import pickled_payloads

    plain = _plain(tmp_path)
    assert pickled_payloads(plain) == []
    aoti = _rewrite(plain, tmp_path / "aoti.pt2", lambda n, d: d)
    with zipfile.ZipFile(aoti, "a") as z:
        z.writestr("fc/data/aotinductor/model/model.so", b"\x7fELF")
    assert pickled_payloads(aoti) == ["data/aotinductor/model/model.so (compiled AOTInductor code)"]


def _opaque(src: Path, dst: Path, marker: Path) -> Path:
    """`src` with a constant stored as an opaque object: torch.export.load reads it with
    `pickle.loads` (the weights-only hold does not cover that)."""
    import pickle

    with zipfile.ZipFile(src) as z:
        root = z.namelist()[0].split("/")[0]
        weights = json.loads(z.read(f"{root}/data/weights/model_weights_config.json"))
    meta = next(iter(weights["config"].values()))["tensor_meta"]  # a float32 tensor's
    payload = pickle.dumps(Payload(marker))
    payload += b"\0" * (-len(payload) % 4)  # read as float32 first; pickle ignores the tail

    def change(name: str, data: bytes) -> bytes:
        if name.endswith("model_constants_config.json"):
            return json.dumps({"config": {"obj": {"path_name": "opaque_obj_0",
                                                  "is_param": False, "use_pickle": False,
                                                  "tensor_meta": meta}}}).encode()
        return data

    out = _rewrite(src, dst, change)
    with zipfile.ZipFile(out, "a") as z:
        z.writestr(f"{root}/data/constants/opaque_obj_0", payload)
    return out


@pytest.mark.parametrize("name", ["data", "models"])
def test_a_pt2_named_like_a_folder_of_its_own_is_gated_and_held(tmp_path, name):
    """torch.export.save(ep, "data.pt2") names the zip's folder `data/`: the gate read
    nothing to refuse, and the opaque object's pickle ran as the file loaded."""
    import torch

    from farm.pipeline import ingest, modelfile

    marker = tmp_path / "ran"
    src = tmp_path / "plain" / f"{name}.pt2"
    src.parent.mkdir()
    torch.export.save(torch.export.export(torch.nn.Linear(4, 2).eval(),
                                          (torch.randn(1, 4),)), src)
    assert zipfile.ZipFile(src).namelist()[0].startswith(f"{name}/data/")
    evil = _opaque(src, tmp_path / f"{name}.pt2", marker)
    with pytest.raises(UsageError, match="constant obj"):
        modelfile.check_model(evil, None, allow_pickle=False)
    with pytest.raises(UsageError, match="not plain tensors"):  # loaded past the gate: held
        ingest.load(evil, None, "float32", allow_pickle=False)
    assert not marker.exists()
    assert modelfile.check_model(src, None, allow_pickle=False) == "torch.export"


def test_an_entry_outside_the_zips_folder_is_refused(tmp_path):
    """torch reads `<folder of the first entry>/<name>`: an entry elsewhere is something the
    gate and torch would read differently."""
    from farm.pipeline import modelfile

    plain = _plain(tmp_path)
    odd = _rewrite(plain, tmp_path / "odd.pt2", lambda n, d: d)
    with zipfile.ZipFile(odd, "a") as z:
        z.writestr("other/data/constants/opaque_obj_0", b"x")
    with pytest.raises(Exception, match="outside the zip's folder"):
        modelfile.check_model(odd, None, allow_pickle=False)


def _script(tmp_path: Path, source: str, make: str = "M") -> Path:
    """A TorchScript file of the module `M` in `source` (scripted from a file: TorchScript
    reads its source)."""
    import importlib.util

    import torch

    mod_path = tmp_path / "scripted_m.py"
    mod_path.write_text("import torch\n\n\n" + source)
    spec = importlib.util.spec_from_file_location("scripted_m", mod_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "m.pt"
    torch.jit.script(getattr(module, make)()).save(str(out))
    return out


WRITES_A_FILE = '''
class M(torch.nn.Module):
    def forward(self, x):
        t = torch.from_file("{target}", shared=True, size=4)
        t.copy_(x.flatten()[:4] + 1)
        return x * 2 + t.sum() * 0
'''

SETS_STATE = '''
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.n = 1

    def forward(self, x):
        return x * self.n

    @torch.jit.export
    def __getstate__(self):
        return (self.n, self.training)

    @torch.jit.export
    def __setstate__(self, state: tuple[int, bool]):
        self.n = state[0]
        self.training = state[1]
'''


def test_a_torchscript_file_that_writes_a_file_is_refused_without_the_flag(tmp_path):
    """A scripted forward calling torch.from_file(path, shared=True) and copy_ wrote a file of
    the user's (a .pth in site-packages is code for the next Python)."""
    from farm.pipeline import ingest

    target = tmp_path / "victim.bin"
    target.write_bytes(b"\0" * 16)
    evil = _script(tmp_path, WRITES_A_FILE.format(target=target))
    with pytest.raises(UsageError, match="aten::from_file"):
        ingest.load(evil, [(1, 8)], "float32", allow_pickle=False)
    assert target.read_bytes() == b"\0" * 16  # never ran


WRITES_IN_A_HOOK = '''
class M(torch.nn.Module):
    def forward(self, x):
        return x * 2


def hook(mod: torch.nn.Module, inp: tuple[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    t = torch.from_file("{target}", shared=True, size=4)
    t.copy_(out.flatten()[:4] + 1)
    return out + t.sum() * 0


def make():
    m = M()
    m.register_forward_hook(hook)
    return m
'''


def test_a_torchscript_forward_hook_that_writes_a_file_is_refused(tmp_path):
    """A scripted module's forward hooks are functions of their own (not methods), run
    around forward: their graphs are checked like the methods'."""
    from farm.pipeline import ingest

    target = tmp_path / "victim.bin"
    target.write_bytes(b"\0" * 16)
    evil = _script(tmp_path, WRITES_IN_A_HOOK.format(target=target), "make")
    with pytest.raises(UsageError, match="aten::from_file"):
        ingest.load(evil, [(1, 8)], "float32", allow_pickle=False)
    assert target.read_bytes() == b"\0" * 16  # never ran


def test_torchscript_code_that_runs_as_it_loads_is_refused_before_loading(tmp_path):
    from farm.pipeline import modelfile

    evil = _script(tmp_path, SETS_STATE)
    with pytest.raises(UsageError, match="__setstate__"):
        modelfile.check_model(evil, [(1, 4)], allow_pickle=False)
    assert modelfile.check_model(evil, [(1, 4)], allow_pickle=True) == "torchscript"


def test_a_pt2_whose_graph_reads_a_file_is_refused(tmp_path, monkeypatch):
    """The same check for a .pt2's graph: `aten.from_file` and kin never run unasked (torch
    cannot export such a graph itself, a crafted file can hold one: the program is doctored
    here as torch.export.load would return it)."""
    import torch

    from farm.pipeline import ingest

    class M(torch.nn.Module):
        def forward(self, x):
            return x * 2

    path = tmp_path / "reads.pt2"
    ep = torch.export.export(M(), (torch.randn(1, 4),))
    torch.export.save(ep, path)
    out = next(n for n in ep.graph.nodes if n.op == "output")
    with ep.graph.inserting_before(out):
        ep.graph.call_function(torch.ops.aten.from_file.default, (str(tmp_path / "f"),),
                               {"shared": True, "size": 4})
    monkeypatch.setattr(torch.export, "load", lambda *a, **k: ep)
    with pytest.raises(UsageError, match="aten::from_file"):
        ingest.load(path, None, "float32", allow_pickle=False)
    assert not (tmp_path / "f").exists()


def test_plain_torchscript_and_export_pass_the_operator_check(tmp_path):
    """A traced CNN block and a scripted one with control flow hold torch's computing
    operators only: nothing refused."""
    import torch

    from farm.pipeline.operators import export_problems, torchscript_problems

    block = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, groups=1), torch.nn.BatchNorm2d(8),
                                torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, groups=8),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(8, 4)).eval()
    x = torch.randn(1, 3, 16, 16)
    assert torchscript_problems(torch, torch.jit.trace(block, x)) == []
    assert torchscript_problems(torch, torch.jit.script(block)) == []
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).eval()
    assert export_problems(torch, torch.export.export(layer, (torch.randn(1, 5, 16),))) == []
    assert export_problems(torch, torch.export.export(block, (x,))) == []
