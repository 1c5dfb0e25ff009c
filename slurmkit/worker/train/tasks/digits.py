"""An MLP classifier on handwriting-like digits (1,797 8x8 images, as many as scikit-learn's bundled
set): drawn here from a 5x7 glyph of each digit, shifted, with uneven strokes, strokes left out and
noise. Made from a fixed seed, the same on every machine and rank; nothing is downloaded and no
package beyond torch is needed."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from slurmkit.config.train import TrainConfig
from slurmkit.worker.train.flops import dense_flops_per_sample

TEST_FRACTION = 0.2
SPLIT_SEED = 1234  # fixed, so every seed is evaluated on the same held-out images
SAMPLES = 1797
DATA_SEED = 8
GLYPHS = ("01110 10001 10011 10101 11001 10001 01110", "00100 01100 00100 00100 00100 00100 01110",
          "01110 10001 00001 00010 00100 01000 11111", "11111 00010 00100 00010 00001 10001 01110",
          "00010 00110 01010 10010 11111 00010 00010", "11111 10000 11110 00001 00001 10001 01110",
          "00110 01000 10000 11110 10001 10001 01110", "11111 00001 00010 00100 01000 01000 01000",
          "01110 10001 10001 01110 10001 10001 01110", "01110 10001 10001 01111 00001 00010 01100")
"""Each digit as 7 rows of 5 pixels (the classic 5x7 dot-matrix font)."""


def images(n: int = SAMPLES, seed: int = DATA_SEED) -> tuple[torch.Tensor, torch.Tensor]:
    """n 8x8 images (values 0 to 1, flattened to 64) and their labels, 0-9 in turn."""
    gen = torch.Generator().manual_seed(seed)
    glyphs = torch.tensor([[[int(c) for c in row] for row in g.split()] for g in GLYPHS], dtype=torch.float32)
    y = torch.arange(n) % 10
    x = torch.zeros(n, 8, 8)
    shifts = torch.randint(0, 4, (n, 2), generator=gen)  # 5x7 in 8x8: 4 columns, 2 rows of room (clipped)
    for i in range(n):
        dx, dy = int(shifts[i, 0]), min(int(shifts[i, 1]), 1)
        x[i, dy:dy + 7, dx:dx + 5] = glyphs[int(y[i])][:, :8 - dx]
    stroke = 0.55 + 0.45 * torch.rand(n, 8, 8, generator=gen)
    kept = torch.rand(n, 8, 8, generator=gen) > 0.05  # a twentieth of the stroke left out
    noise = 0.08 * torch.randn(n, 8, 8, generator=gen)
    x = (x * stroke * kept + noise).clamp(0.0, 1.0)
    return x.reshape(n, 64), y


def data() -> tuple[TensorDataset, TensorDataset]:
    x, y = images()
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(SPLIT_SEED))
    n_test = int(len(x) * TEST_FRACTION)
    test, train = order[:n_test], order[n_test:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])


def model(cfg: TrainConfig) -> nn.Sequential:
    return nn.Sequential(nn.Linear(64, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU(),
                         nn.Linear(cfg.hidden, 10))


def flops_per_sample(net: nn.Module) -> float:
    return dense_flops_per_sample([m.weight.numel() for m in net.modules() if isinstance(m, nn.Linear)])


def loss_fn(net: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(net(x), y)


@torch.no_grad()
def accuracy(net: nn.Module, dataset: TensorDataset, device: torch.device) -> float:
    net.eval()
    x, y = (t.to(device) for t in dataset.tensors)
    return (net(x).argmax(dim=1) == y).float().mean().item()
