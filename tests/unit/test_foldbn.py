"""Inference batch norms folded into their convolutions: same outputs, no norm left."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn


class ConvNorms(nn.Module):
    """A conv with bias + BN, a depthwise conv without bias + BN, a conv1d + BN, and a conv whose
    output is also used elsewhere (a residual): that one must keep its norm."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.dw, self.b2 = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8)
        self.c3, self.b3 = nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8)
        self.c4, self.b4 = nn.Conv1d(8, 4, 3), nn.BatchNorm1d(4, affine=False)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = self.b2(self.dw(y))
        z = self.c3(y)
        y = self.b3(z) + z  # z has two users: not folded
        return self.b4(self.c4(y.mean(3)))


def model_file(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    model = ConvNorms().eval()
    for m in model.modules():  # statistics far from the identity, as a trained net has
        if isinstance(m, nn.BatchNorm2d | nn.BatchNorm1d):
            m.running_mean.uniform_(-2, 2)
            m.running_var.uniform_(0.1, 4)
            if m.affine:
                m.weight.data.uniform_(0.2, 3)
                m.bias.data.uniform_(-2, 2)
    path = tmp_path / "convnorms.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(1, 3, 12, 12),)), path)
    return path


def run(mod, inputs):
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(i) for i in inputs])
    return out[0].numpy() if hasattr(out, "__getitem__") else out.numpy()


def test_batch_norms_fold_into_their_convolutions_and_outputs_stay(tmp_path: Path):
    from farm.pipeline import ingest
    from farm.pipeline.foldbn import fold_batch_norm

    bundle = ingest.load(model_file(tmp_path))
    before = bundle.mod.script().count("R.nn.batch_norm(")
    folded = fold_batch_norm(bundle.mod)
    assert before == 4
    assert folded.script().count("R.nn.batch_norm(") == 1  # the residual's conv keeps its norm
    got = run(folded, bundle.inputs)
    np.testing.assert_allclose(got, bundle.outputs[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run(bundle.mod, bundle.inputs), got, rtol=1e-5, atol=1e-5)
    assert bundle.mod.script().count("R.nn.batch_norm(") == 4  # the module given is untouched


def test_a_model_without_foldable_norms_is_returned_as_it_is(tmp_path: Path):
    import tvm_ffi

    from farm.pipeline import ingest
    from farm.pipeline.foldbn import fold_batch_norm

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    path = tmp_path / "plain.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(1, 3, 8, 8),)), path)
    mod = ingest.load(path).mod
    assert tvm_ffi.structural_equal(fold_batch_norm(mod), mod)
