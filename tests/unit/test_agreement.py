"""The step's agreement rides on DDP's gradient all-reduce: two real gloo ranks on this machine."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

RANK_CODE = """
import json, sys
import torch
from slurmkit.worker.process_group import distributed
from slurmkit.worker.train.trainer import Trainer, TrainerOptions

dtype = getattr(torch, sys.argv[2])
torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(64, 4).to(dtype), torch.randn(64, 1).to(dtype))
with distributed() as dist:
    net = torch.nn.Linear(4, 1).to(dtype)
    trainer = Trainer(net, torch.optim.SGD(net.parameters(), lr=0.01), data,
                      lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]), dist,
                      TrainerOptions(steps=6, micro_batch=4, grad_accum=2))
    # Rank 1 alone votes: 2 for "stop" at step 3, 1 for "other" at steps 4 and 5.
    trainer.votes["stop"] = lambda: 2 if dist.rank == 1 and trainer.state.step == 2 else 0
    trainer.votes["other"] = lambda: 1 if dist.rank == 1 and trainer.state.step in (3, 4) else 0
    seen = []
    trainer.hooks.append(lambda t, r: seen.append([r["step"], r["loss"], dict(t.agreed)]))
    trainer.fit()
    out = {"seen": seen, "rode": trainer.agreement.rode}
    open(sys.argv[1] + f"/rank{dist.rank}.json", "w").write(json.dumps(out))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_env(rank: int, port: int) -> dict[str, str]:
    """What torchrun sets for one of two ranks on this machine."""
    return {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def run_two_ranks(code: str, args: list[str],
                  rank_env: Callable[[int, int], dict[str, str]] = torchrun_env) -> None:
    """`python -P -c code *args` as two ranks on this machine, each with rank_env(rank, a free port)
    over this process's environment less its launchers' variables; both must exit 0."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_", "TORCHELASTIC_"))}
    procs = [subprocess.Popen([sys.executable, "-P", "-c", code, *args], env={**env, **rank_env(r, port)},
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]


def two_ranks(tmp_path: Path, dtype: str) -> list[dict[str, object]]:
    run_two_ranks(RANK_CODE, [str(tmp_path), dtype])
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize("dtype, rides", [("float32", 6), ("bfloat16", 0)],
                         ids=["rides-on-fp32-gradients", "own-collective-for-bf16-gradients"])
def test_every_rank_reads_the_same_agreement_and_loss_at_every_step(tmp_path: Path, dtype: str, rides: int) -> None:
    ranks = two_ranks(tmp_path, dtype)
    assert ranks[0]["seen"] == ranks[1]["seen"]  # same step, same mean loss, same agreement, on both ranks
    agreed = [(step, a) for step, _, a in ranks[0]["seen"]]  # type: ignore[attr-defined]
    assert agreed == [(1, {"stop": 0, "other": 0}), (2, {"stop": 0, "other": 0}), (3, {"stop": 2, "other": 0}),
                      (4, {"stop": 0, "other": 1}), (5, {"stop": 0, "other": 1}), (6, {"stop": 0, "other": 0})]
    # Every step's agreement rode on the gradient all-reduce, or (bf16) none did and each made its own.
    assert ranks[0]["rode"] == ranks[1]["rode"] == rides
