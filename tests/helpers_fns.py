"""Callables that tests submit; importable on the compute nodes (tests/ is on their sys.path)."""

from __future__ import annotations

import os
import socket
import time
from typing import Any


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

    from slurmkit.worker.process_group import distributed
    from slurmkit.worker.train.trainer import Trainer, TrainerOptions

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


class _Finalized:
    """Writes `path` when the interpreter finalizes it (a module global collected at exit)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __del__(self, _open: Any = open) -> None:  # builtins may be gone by then
        with _open(self.path, "w") as f:
            f.write("finalized")


def exits_like_a_rank(marks: str, how: str) -> str:
    """For tests/unit/test_rank_exit.py: leaves an atexit handler, a non-daemon thread still at work, an
    idle thread pool, and an object only the interpreter's finalization would collect, each (but
    the pool) writing its mark in `marks`; then returns, raises or calls sys.exit(3) as `how` says."""
    import atexit
    import concurrent.futures
    import sys
    import threading

    atexit.register(lambda: open(os.path.join(marks, "atexit"), "w").close())

    def late() -> None:
        time.sleep(0.2)
        open(os.path.join(marks, "thread"), "w").close()

    threading.Thread(target=late).start()
    pool = concurrent.futures.ThreadPoolExecutor(2)  # left idle, never shut down, as inductor's compile pool is
    pool.submit(lambda: None).result()
    sys.modules[__name__].__dict__["_pool"] = pool
    sys.modules[__name__].__dict__["_finalized"] = _Finalized(os.path.join(marks, "finalized"))
    if how == "raise":
        raise ValueError("the rank's own error")
    if how == "exit":
        sys.exit(3)
    return "done"


def echo_float(value: str) -> None:
    """Logs the float a string names as `result`: "nan" and "inf" too (a sweep's metric that is not a number)."""
    import slurmkit.tracking

    slurmkit.tracking.log({"result": float(value)}, step=1)


def always_fails(x: float) -> float:
    raise ValueError(f"this objective fails at every x ({x})")


def paced_steps(steps: int, step_s: float) -> int:
    """A function run with a slurmkit.Checkpoint whose rank 1 takes four times as long a step as
    rank 0 (its own work: the sleep); no save. Returns the rank."""
    import slurmkit

    rank, _, _ = slurmkit.distributed.init()
    ckpt = slurmkit.Checkpoint(every=0)
    for step in range(1, steps + 1):
        time.sleep(step_s * (4 if rank == 1 else 1))
        ckpt.step(step, {"step": step})
    ckpt.close()
    return rank
