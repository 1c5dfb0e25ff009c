"""Callables that tests submit; importable on the compute nodes (tests/ is on their sys.path)."""

from __future__ import annotations

import os
import socket
import time


def add(a: int, b: int) -> dict[str, object]:
    return {"sum": a + b, "host": socket.gethostname(), "rank": int(os.environ.get("SLURM_PROCID", "0"))}


def sleep(seconds: float) -> str:
    time.sleep(seconds)
    return "slept"


def fail(message: str) -> None:
    raise ValueError(message)


def custom_trainer(steps: int) -> dict[str, object]:
    """A user's own callable that brings its model, optimizer and data to slurmkit's Trainer."""
    import torch
    from torch.utils.data import TensorDataset

    from slurmkit.worker.dist import distributed
    from slurmkit.worker.trainer import Trainer, TrainerOptions

    with distributed() as dist:
        torch.manual_seed(0)
        x = torch.randn(256, 4)
        data = TensorDataset(x, x @ torch.tensor([1.0, -2.0, 3.0, 0.5]))
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)

        def loss_fn(m: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            return torch.nn.functional.mse_loss(m(batch[0]).squeeze(-1), batch[1])

        trainer = Trainer(model, opt, data, loss_fn, dist, TrainerOptions(steps=steps, micro_batch=16, seed=0))
        return trainer.fit()


def sleep_unless_restarted() -> dict[str, int]:
    """Blocks in its first incarnation (until a stop signal); returns at once once requeued."""
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    print("started", restarts, flush=True)
    if not restarts:
        time.sleep(300)
    return {"restarts": restarts}
