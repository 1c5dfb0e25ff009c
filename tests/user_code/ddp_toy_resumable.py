# tests/user_code/ddp_toy.py, a user's own DDP script, with slurmkit's fault tolerance added: the
# lines marked `# slurmkit: N` (docs/fault-tolerance.md, "Your own script"). Preempted, it stops at
# the step its ranks agree on, saves it, and the requeued job goes on from there: no step lost.
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

import slurmkit  # slurmkit: 1


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
    ckpt = slurmkit.Checkpoint(every=25)  # slurmkit: 2
    state, start = ckpt.restore(), 0  # slurmkit: 3
    if state is not None:  # slurmkit: 4
        model.module.load_state_dict(state["model"])  # slurmkit: 5
        optimizer.load_state_dict(state["optimizer"])  # slurmkit: 6
        gen.set_state(ckpt.rank_state)  # slurmkit: 7
        start = state["step"]  # slurmkit: 8
    for i in range(start, steps):  # slurmkit: 9 (was: range(steps))
        optimizer.zero_grad()
        outputs = model(torch.randn(20, 10, generator=gen))
        loss = loss_fn(outputs, torch.randn(20, 5, generator=gen))
        loss.backward()
        optimizer.step()
        print(f"rank={rank} step={i + 1} loss={loss.item():.6f}", flush=True)
        time.sleep(step_time)  # stands in for a bigger model's step
        ckpt.step(i + 1, {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),  # slurmkit: 10
                          "step": i + 1}, rank_state=gen.get_state())
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
