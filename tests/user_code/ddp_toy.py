# A user's own DDP training script, written the way PyTorch's published DDP examples are
# (an env:// process group from MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE, a toy model wrapped in
# DistributedDataParallel, gloo on CPU). It knows nothing of slurmkit or Slurm: the tests run it as it
# is, as a `command` under srun and torchrun and from the Python API, and do not edit it.
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(steps, step_time):
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial weights everywhere; DDP broadcasts rank 0's anyway
    model = DDP(ToyModel())
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own data
    for i in range(steps):
        optimizer.zero_grad()
        outputs = model(torch.randn(20, 10, generator=gen))
        loss = loss_fn(outputs, torch.randn(20, 5, generator=gen))
        loss.backward()
        optimizer.step()
        print(f"rank={rank} step={i + 1} loss={loss.item():.6f}", flush=True)
        time.sleep(step_time)  # stands in for a bigger model's step
    # Data parallel: after every step each rank holds the same weights; show it.
    checksum = torch.tensor([sum(p.detach().double().sum().item() for p in model.parameters())], dtype=torch.float64)
    gathered = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, checksum)
    same = all(torch.equal(g, gathered[0]) for g in gathered)
    print(f"rank={rank} checksum={checksum.item()!r}", flush=True)
    print(f"rank={rank} world={dist.get_world_size()} local={os.environ['LOCAL_RANK']} steps={steps} "
          f"weights_equal={same}", flush=True)


def spmd_main(steps, step_time):
    env_dict = {key: os.environ[key] for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    print(f"[{os.getpid()}] Initializing process group with: {env_dict}", flush=True)
    dist.init_process_group(backend="gloo")
    demo_basic(steps, step_time)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.0)
    args = parser.parse_args()
    spmd_main(args.steps, args.step_time)
