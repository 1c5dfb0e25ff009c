"""A small GPT (nanoGPT-style) on a synthetic token stream: the throughput and MFU workload."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from slurmkit.config.train import TrainConfig
from slurmkit.worker.train.flops import gpt_flops_per_token


class Block(nn.Module):
    def __init__(self, d: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: TrainConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg.d_model, cfg.n_head) for _ in range(cfg.n_layer))
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.tok.weight  # tied, as in GPT-2
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        # GPT-2's N(0, 0.02): with the default N(0, 1) embeddings the tied head's logits explode.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def non_embedding_params(net: GPT) -> int:
    """N in 6N: every parameter but the (tied) token and position embeddings."""
    return sum(p.numel() for p in net.parameters()) - net.tok.weight.numel() - net.pos.weight.numel()


def flops_per_token(net: GPT, cfg: TrainConfig) -> float:
    return gpt_flops_per_token(non_embedding_params(net), cfg.n_layer, cfg.n_head, cfg.d_model // cfg.n_head,
                               cfg.seq_len)


def data(cfg: TrainConfig) -> TensorDataset:
    """Sequences of a few repeated random motifs: learnable structure, fixed by the seed."""
    g = torch.Generator().manual_seed(cfg.seed + 7)
    motifs = torch.randint(0, cfg.vocab_size, (64, 8), generator=g)
    picks = torch.randint(0, len(motifs), (cfg.dataset_size, cfg.seq_len // 8 + 2), generator=g)
    stream = motifs[picks].reshape(cfg.dataset_size, -1)[:, : cfg.seq_len + 1]
    return TensorDataset(stream[:, :-1].contiguous(), stream[:, 1:].contiguous())


def loss_fn(net: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    logits = net(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
