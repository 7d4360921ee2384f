"""Models of the kinds users bring import into TVM (farm/pipeline/ingest.py)."""

from __future__ import annotations

import numpy as np
import pytest


def test_a_traced_transformer_encoder_layer_imports(tmp_path):
    """TorchScript of torch's own nn.TransformerEncoderLayer: its traced head-size arithmetic
    converts to div.Scalar_mode, which TVM's frontend lacks (farm/pipeline/ingest.py's twins)."""
    import torch

    from farm.pipeline import ingest

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
    x = torch.randn(2, 8, 32)
    path = tmp_path / "encoder.pt"
    torch.jit.trace(layer, (x,), check_trace=False).save(str(path))
    bundle = ingest.load(path, [(2, 8, 32)])
    assert bundle.fmt == "torchscript"
    assert "main" in [gv.name_hint for gv in bundle.mod.get_global_vars()]
    assert np.asarray(bundle.outputs[0]).shape == (2, 8, 32)


def dynamic_export(path):
    """A small CNN exported with a dynamic batch dim in [1, 8]; writes `path`."""
    import torch

    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(4 * 6 * 6, 3)).eval()
    batch = torch.export.Dim("batch", min=1, max=8)
    ep = torch.export.export(net, (torch.randn(2, 1, 8, 8),), dynamic_shapes=({0: batch},))
    torch.export.save(ep, str(path))
    return path


def static_shape(bundle) -> str:
    """The shape of main's input as TVMScript prints it (a symbolic dim prints its name)."""
    head = bundle.mod["main"].script().split("def main(", 1)[1]
    return head.split("R.Tensor(", 1)[1].split(", dtype", 1)[0]


def test_a_dynamic_export_is_specialized_to_the_shape_tuned_for(tmp_path):
    """MetaSchedule tunes static shapes: before, a dynamic batch was imported as a symbolic
    dim (its tuned model no faster than the untuned one) and --input-shape 4,... was refused
    as "exported with static shape [2, ...]"."""
    from farm.pipeline import ingest

    path = dynamic_export(tmp_path / "dyn.pt2")
    bundle = ingest.load(path, [(4, 1, 8, 8)])
    assert bundle.inputs[0].shape == (4, 1, 8, 8) and bundle.outputs[0].shape == (4, 3)
    assert static_shape(bundle) == "(4, 1, 8, 8)"
    assert static_shape(ingest.load(path, None)) == "(2, 1, 8, 8)"  # the export's example


@pytest.mark.parametrize("shape,needle", [
    ((9, 1, 8, 8), "input 0 dim 0 is dynamic in [1, 8] in the export; --input-shape gives 9"),
    ((4, 2, 8, 8), "(dim 1 static); re-export the model to tune shape [4, 2, 8, 8]"),
])
def test_a_shape_the_export_cannot_take_is_refused(tmp_path, shape, needle):
    from farm.core.errors import UsageError
    from farm.pipeline import ingest

    path = dynamic_export(tmp_path / "dyn.pt2")
    with pytest.raises(UsageError) as e:
        ingest.load(path, [shape])
    assert needle in str(e.value)


def test_outputs_are_compared_in_the_order_the_imported_model_returns_them(tmp_path):
    """A dict output is flattened as torch.export does (insertion order): before, torch's
    outputs were taken in sorted key order, so a model returning {"logits", "feat"} was
    compared output by output with the wrong one and "numerics DO NOT match torch"."""
    import torch
    import tvm
    from tvm import relax

    from farm.pipeline import ingest

    class TwoHeads(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(6, 5)

        def forward(self, x):
            return {"logits": self.fc(x), "feat": x * 2.0}

    path = tmp_path / "heads.pt2"
    torch.export.save(torch.export.export(TwoHeads().eval(), (torch.randn(2, 6),)), str(path))
    bundle = ingest.load(path, None)
    vm = relax.VirtualMachine(tvm.compile(bundle.mod, target="llvm"), tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(i) for i in bundle.inputs])
    assert [o.shape for o in bundle.outputs] == [(2, 5), (2, 6)]
    for tvm_out, torch_out in zip(got, bundle.outputs, strict=True):
        np.testing.assert_allclose(tvm_out.numpy(), torch_out, rtol=1e-5, atol=1e-5)


def compiled(bundle, tmp_path):
    """compile_and_check of the model on this machine's CPU with an empty log (tuned and
    untuned both TVM's default schedules)."""
    import tvm

    from farm.pipeline import compile as compile_stage
    from farm.pipeline.extract import fuse

    target = {"kind": "llvm"}
    (tmp_path / "log").mkdir()
    return compile_stage.compile_and_check(compile_stage.ModelCheck(
        fused=fuse(bundle.mod, tvm.target.Target(target)), target_json=target,
        log_dir=tmp_path / "log", out_dir=tmp_path, inputs=bundle.inputs,
        expected=bundle.outputs, task_names={}, tuned_names=set(), untunable=[], repeat=1,
        number=1))


def test_a_model_tvm_imports_wrongly_is_told_from_a_tuning_error(tmp_path):
    """nn.GRU: TVM 0.27's import computes garbage (max abs err ~1e21, seen on an unseen model);
    the job says the untuned build does not match torch either, so it is the import, not the
    farm's tuning. A model TVM imports right matches, tuned and untuned."""
    import torch

    from farm.pipeline import ingest
    from farm.pipeline.summary import numerics_hint

    class Gru(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gru = torch.nn.GRU(8, 12, batch_first=True)

        def forward(self, x):
            return self.gru(x)[0][:, -1]

    torch.manual_seed(0)
    for name, net, shape, ok in (("gru", Gru(), (2, 5, 8), False),
                                 ("mlp", torch.nn.Linear(8, 12), (2, 8), True)):
        path = tmp_path / f"{name}.pt2"
        torch.export.save(torch.export.export(net.eval(), (torch.randn(*shape),)), str(path))
        (tmp_path / name).mkdir()
        result = compiled(ingest.load(path, None), tmp_path / name)
        assert (result.numerics_ok, result.untuned_numerics_ok) == (ok, ok), name
    hint = numerics_hint({"numerics_ok": False, "untuned_numerics_ok": False})
    assert "TVM's import of the model is wrong" in hint


def test_a_torchscript_model_takes_one_dtype_per_input(tmp_path):
    """Token ids (int64) and a mask (float32): --dtype "int64;float32", one per input."""
    import torch

    from farm.core.errors import UsageError
    from farm.pipeline import ingest

    class Masked(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4)

        def forward(self, ids, mask):
            return (self.emb(ids) * mask.unsqueeze(-1)).sum(1)

    ids, mask = torch.randint(0, 10, (2, 6)), torch.ones(2, 6)
    path = tmp_path / "masked.pt"
    torch.jit.trace(Masked().eval(), (ids, mask)).save(str(path))
    bundle = ingest.load(path, [(2, 6), (2, 6)], dtype="int64;float32")
    assert [str(i.dtype) for i in bundle.inputs] == ["int64", "float32"]
    assert bundle.outputs[0].shape == (2, 4)
    with pytest.raises(UsageError, match="--dtype gives 3 dtypes for 2 input"):
        ingest.load(path, [(2, 6), (2, 6)], dtype="int64;float32;int32")


def test_a_model_with_topk_and_cumsum_builds(tmp_path):
    """Sort and scan operators are dispatched to TIR before fusion (farm/pipeline/extract.py), as
    tvm.compile does: before, the build failed with "CodeGenVM cannot emit this Relax operator
    directly ... R.topk" (seen on an unseen model with a top-k head)."""
    import torch

    from farm.pipeline import ingest

    class TopK(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)

        def forward(self, x):
            y = self.fc(x)
            values, _ = torch.topk(y, 4, dim=-1)
            return values, torch.cumsum(y, dim=1)

    path = tmp_path / "topk.pt2"
    torch.export.save(torch.export.export(TopK().eval(), (torch.randn(3, 16),)), str(path))
    result = compiled(ingest.load(path, None), tmp_path)
    assert result.numerics_ok and result.untuned_numerics_ok


def test_a_model_exported_in_training_mode_is_refused_with_the_fix(tmp_path):
    """Exported without model.eval(): batch norm on batch statistics, dropout that drops. TVM
    compiles for inference, so the job tuned for ever and then said "numerics DO NOT match
    torch" (blaming TVM's import); now it is refused before anything is tuned."""
    import torch

    from farm.core.errors import UsageError
    from farm.pipeline import ingest

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                              torch.nn.Dropout(0.5), torch.nn.Flatten())
    x = torch.randn(2, 3, 6, 6)
    torch.export.save(torch.export.export(net, (x,)), str(tmp_path / "train.pt2"))  # no eval()
    with pytest.raises(UsageError) as e:
        ingest.load(tmp_path / "train.pt2", None)
    assert "training mode (batch_norm, dropout)" in str(e.value) and "model.eval()" in e.value.hint
    torch.export.save(torch.export.export(net.eval(), (x,)), str(tmp_path / "eval.pt2"))
    assert ingest.load(tmp_path / "eval.pt2", None).outputs[0].shape == (2, 64)
