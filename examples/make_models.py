"""Write small example models to tune: a residual CNN, a depthwise mobile block, a two-headed
depthwise mobile net (a class head and a box head, SSD-style), a transformer block.

    python examples/make_models.py [OUT_DIR]

Each model is written as torch.export (.pt2) and TorchScript (.pt). They are
random-weight models made here (nothing is downloaded).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn


class TinyResNet(nn.Module):
    def __init__(self, width: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width),
                                   nn.ReLU(), nn.Conv2d(width, width, 3, padding=1),
                                   nn.BatchNorm2d(width))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        y = torch.relu(self.block(y) + y)
        return self.head(y.mean(dim=(2, 3)))


class MobileBlock(nn.Module):
    def __init__(self, cin: int = 16, expand: int = 4) -> None:
        super().__init__()
        hidden = cin * expand
        self.body = nn.Sequential(
            nn.Conv2d(cin, hidden, 1), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden), nn.BatchNorm2d(hidden),
            nn.ReLU6(), nn.Conv2d(hidden, cin, 1), nn.BatchNorm2d(cin))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand, 3x3 depthwise (stride 1 or 2), 1x1 project."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int = 4) -> None:
        super().__init__()
        hidden = cin * expand
        self.skip = stride == 1 and cin == cout
        self.body = nn.Sequential(
            nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride=stride, padding=1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.skip else self.body(x)


class MobileNetHeads(nn.Module):
    """A small MobileNetV2-style trunk with two heads: class logits, and per-location box
    offsets and scores (an SSD-style detector's outputs); the model returns both."""

    def __init__(self, classes: int = 10, anchors: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False),
                                  nn.BatchNorm2d(16), nn.ReLU6())
        self.trunk = nn.Sequential(InvertedResidual(16, 16, 1), InvertedResidual(16, 24, 2),
                                   InvertedResidual(24, 24, 1), InvertedResidual(24, 32, 2))
        self.classes = nn.Linear(32, classes)
        self.boxes = nn.Conv2d(32, anchors * 4, 3, padding=1)
        self.scores = nn.Conv2d(32, anchors, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = self.trunk(self.stem(x))
        return self.classes(y.mean(dim=(2, 3))), self.boxes(y), torch.sigmoid(self.scores(y))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


MODELS = {
    "resnet": (TinyResNet, (1, 3, 32, 32)),
    "mobile": (MobileBlock, (1, 16, 28, 28)),
    "mobilenet": (MobileNetHeads, (1, 3, 64, 64)),
    "transformer": (TransformerBlock, (1, 32, 64)),
}


def write(name: str, out: Path) -> tuple[Path, Path]:
    cls, shape = MODELS[name]
    torch.manual_seed(0)
    model = cls().eval()
    x = torch.randn(*shape)
    out.mkdir(parents=True, exist_ok=True)
    pt2 = out / f"{name}.pt2"
    pt = out / f"{name}.pt"
    torch.export.save(torch.export.export(model, (x,)), pt2)
    torch.jit.save(torch.jit.trace(model, x), pt)
    return pt2, pt


if __name__ == "__main__":
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "examples")
    for model_name in MODELS:
        for path in write(model_name, out_dir):
            print(path)
