# A user's Lightning script, as one writes it for a Slurm cluster: nothing of slurmkit in it.
# Each training step prints `rank=R step=N ` (N: the global step it runs, from 1), so a test can
# count the steps that ran, and ran twice, and a benchmark can time them (t=).
import argparse
import os
import time

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regression(pl.LightningModule):
    def __init__(self, step_time):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.step_time = step_time

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        print(f"rank={self.global_rank} step={self.global_step + 1} loss={loss.item():.6f} t={time.time():.6f}",
              flush=True)
        time.sleep(self.step_time)  # stands in for a bigger model's step
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--root", default=".")
    parser.add_argument("--after-fit-s", type=float, default=0.0)
    args = parser.parse_args()
    pl.seed_everything(0)
    data = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))
    trainer = pl.Trainer(accelerator="cpu", num_nodes=args.nodes, devices=args.devices, strategy="ddp",
                         max_steps=args.steps, default_root_dir=args.root, logger=False, log_every_n_steps=10,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Regression(args.step_time), DataLoader(data, batch_size=32, shuffle=True))
    print(f"rank={trainer.global_rank} done global_step={trainer.global_step} pid={os.getpid()}", flush=True)
    time.sleep(args.after_fit_s)  # work a script goes on with after fit (an export, an upload)


if __name__ == "__main__":
    main()
