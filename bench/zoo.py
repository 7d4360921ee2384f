"""The bench's model zoo: families the store learns across (bench/learn.py), random weights,
nothing downloaded. Four are the examples' (examples/make_models.py: a residual CNN, a
MobileNetV2 block, a two-headed MobileNet, a transformer block); three are only here:

- `squeeze`: SqueezeNet's fire module (a 1x1 squeeze, then 1x1 and 3x3 expands side by
  side, concatenated), max pooling, a 1x1 classifier conv and global pooling;
- `bottleneck`: ResNet-50's bottleneck block (1x1 reduce, 3x3 strided, 1x1 expand, a
  projection shortcut, the residual add);
- `hybrid`: a conv stem and a depthwise block, then self-attention over the feature map's
  positions (MobileViT-style: convolutions for local, attention for global mixing).

    python bench/zoo.py OUT_DIR [NAME ...]     # writes NAME.pt2 for each (default: all)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from make_models import MODELS as EXAMPLES  # noqa: E402 - examples/ is not a package


class Fire(nn.Module):
    def __init__(self, cin: int, squeeze: int, expand: int) -> None:
        super().__init__()
        self.squeeze = nn.Sequential(nn.Conv2d(cin, squeeze, 1), nn.ReLU())
        self.e1 = nn.Sequential(nn.Conv2d(squeeze, expand, 1), nn.ReLU())
        self.e3 = nn.Sequential(nn.Conv2d(squeeze, expand, 3, padding=1), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.squeeze(x)
        return torch.cat([self.e1(s), self.e3(s)], dim=1)


class SqueezeNet(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.ReLU())
        self.fires = nn.Sequential(Fire(32, 12, 32), nn.MaxPool2d(2))
        self.classifier = nn.Conv2d(64, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.fires(self.stem(x))).mean(dim=(2, 3))


class Bottleneck(nn.Module):
    def __init__(self, cin: int, mid: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
            nn.Conv2d(mid, mid, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(mid),
            nn.ReLU(), nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                    nn.BatchNorm2d(cout))
                      if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.short(x))


class BottleneckNet(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(32), nn.ReLU())
        self.blocks = Bottleneck(32, 24, 96, stride=2)
        self.head = nn.Linear(96, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


class Hybrid(nn.Module):
    def __init__(self, dim: int = 48, heads: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.heads = heads
        self.stem = nn.Sequential(nn.Conv2d(3, dim, 3, stride=2, padding=1), nn.ReLU(),
                                  nn.Conv2d(dim, dim, 3, padding=1, groups=dim), nn.ReLU())
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        b, c, h, w = y.shape
        t = y.flatten(2).transpose(1, 2)  # (b, positions, c)
        q, k, v = self.qkv(self.norm(t)).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, h * w, self.heads, c // self.heads).transpose(1, 2)
                   for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-2, -1) / (c // self.heads) ** 0.5, dim=-1)
        t = t + self.proj((att @ v).transpose(1, 2).reshape(b, h * w, c))
        return self.head(t.mean(dim=1))


MODELS = {
    **EXAMPLES,
    "squeeze": (SqueezeNet, (1, 3, 48, 48)),
    "bottleneck": (BottleneckNet, (1, 3, 32, 32)),
    "hybrid": (Hybrid, (1, 3, 32, 32)),
}


def write(name: str, out: Path) -> Path:
    cls, shape = MODELS[name]
    torch.manual_seed(0)
    model = cls().eval()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(*shape),)), path)
    return path


if __name__ == "__main__":
    out_dir = Path(sys.argv[1])
    for model_name in sys.argv[2:] or list(MODELS):
        print(write(model_name, out_dir))
