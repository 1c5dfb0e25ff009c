"""An MLP classifier on scikit-learn's bundled digits (1,797 8x8 images): nothing is downloaded."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from slurmkit.config.train import TrainConfig
from slurmkit.worker.flops import dense_flops_per_sample

TEST_FRACTION = 0.2
SPLIT_SEED = 1234  # fixed, so every seed is evaluated on the same held-out images


def data() -> tuple[TensorDataset, TensorDataset]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.tensor(bunch.data, dtype=torch.float32) / 16.0
    y = torch.tensor(bunch.target, dtype=torch.long)
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
