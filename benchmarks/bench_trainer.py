"""The Trainer's own cost per step, against a bare hand-written DDP loop measured in the same run.

Two ranks (gloo, torchrun-style environment, one thread each) run, alternately, `pairs` times
(short runs, many pairs: this machine's speed drifts by 2x over seconds, and a pair shares the drift):
- slurmkit's `task: train` path: build(), Incarnation (fault tolerance on, checkpointing off:
  signal votes, watchdog), the default metrics interval;
- a bare loop: the same model, AdamW, LR schedule, DistributedSampler and global batch; DDP; the
  loss read (`.item()`, local) every 10 steps, nothing agreed between ranks.
A step's time is the wall time from the end of one step to the end of the next (hooks, logging
and data included); the first 10 steps of each run are left out. The figure: the ratio of the
medians. Goals: digits <= 1.05, the GPT example at its default size <= 1.02.

Usage: python benchmarks/bench_trainer.py [--model digits|gpt|both] [--pairs 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_restart import free_port, two_ranks

STEPS = {"digits": 100, "gpt": 30}
PAIRS = {"digits": 30, "gpt": 8}
CONFIGS: dict[str, dict[str, Any]] = {"digits": {"model": "digits", "batch_size": 64},
                                      "gpt": {"model": "gpt"}}
WARM = 10
GOAL = {"digits": 1.05, "gpt": 1.02}


def step_times(ends: list[float]) -> float:
    return statistics.median(b - a for a, b in zip(ends[WARM:], ends[WARM + 1:], strict=False))


def trainer_run(cfg: Any, dist: Any, run_dir: Path) -> float:
    from slurmkit.worker.train.incarnation import Incarnation
    from slurmkit.worker.train.tasks.train_task import build

    trainer, _ = build(cfg, dist, run_dir)
    life = Incarnation(dist, str(run_dir), cfg)
    life.attach(trainer)
    ends: list[float] = []
    trainer.hooks.append(lambda t, r: ends.append(time.perf_counter()))
    try:
        trainer.fit()
        life.finish()
    finally:
        life.close()
        trainer.metrics.close()
    return step_times(ends)


def bare_run(cfg: Any, dist: Any) -> float:
    import torch
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    from slurmkit.worker.train.tasks import digits, gpt
    from slurmkit.worker.train.trainer import warmup_cosine

    torch.manual_seed(cfg.seed)
    net: torch.nn.Module
    if cfg.model == "digits":
        data, net, loss_fn = digits.data()[0], digits.model(cfg), digits.loss_fn
    else:
        data, net, loss_fn = gpt.data(cfg), gpt.GPT(cfg), gpt.loss_fn
    model = DistributedDataParallel(net)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(cfg.steps))
    sampler: DistributedSampler[Any] = DistributedSampler(data, num_replicas=dist.world_size, rank=dist.rank,
                                                          shuffle=True, seed=cfg.seed, drop_last=True)
    loader = DataLoader(data, batch_size=cfg.per_rank_batch(dist.world_size), sampler=sampler, drop_last=True)
    ends: list[float] = []
    step, epoch = 0, 0
    while step < cfg.steps:
        sampler.set_epoch(epoch)
        for batch in loader:
            loss = loss_fn(model, batch)
            loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step % 10 == 0 and dist.is_main:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            ends.append(time.perf_counter())
            if step == cfg.steps:
                break
        epoch += 1
    return step_times(ends)


def worker(model: str, pairs: int, folder: Path) -> None:
    from slurmkit.config.train import TrainConfig
    from slurmkit.worker.process_group import distributed

    cfg = TrainConfig.model_validate({**CONFIGS[model], "steps": STEPS[model], "checkpoint_every": 0, "seed": 0})
    out: dict[str, list[float]] = {"trainer": [], "bare": []}
    with distributed() as dist:
        for pair in range(pairs):
            for name in ("trainer", "bare") if pair % 2 == 0 else ("bare", "trainer"):  # neither always first
                out[name].append(trainer_run(cfg, dist, folder / f"run-{pair}") if name == "trainer"
                                 else bare_run(cfg, dist))
        if dist.is_main:
            (folder / "result.json").write_text(json.dumps(out))


def measure(model: str, pairs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        two_ranks([__file__, "--worker", model, "--pairs", str(pairs), "--folder", tmp], free_port())
        out = json.loads((Path(tmp) / "result.json").read_text())
    ratios = [t / b for t, b in zip(out["trainer"], out["bare"], strict=True)]
    return {"model": model, "steps_per_run": STEPS[model], "pairs": pairs,
            "trainer_median_step_ms": round(statistics.median(out["trainer"]) * 1e3, 3),
            "bare_median_step_ms": round(statistics.median(out["bare"]) * 1e3, 3),
            "pair_ratios": [round(r, 3) for r in ratios], "ratio": round(statistics.median(ratios), 3),
            "ratio_of_fastest_runs": round(min(out["trainer"]) / min(out["bare"]), 3), "goal": GOAL[model]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["digits", "gpt", "both"], default="both")
    parser.add_argument("--pairs", type=int, help="default: 10 for digits, 8 for gpt")
    parser.add_argument("--worker", choices=list(STEPS))
    parser.add_argument("--folder")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.pairs, Path(args.folder))
        return
    for model in (["digits", "gpt"] if args.model == "both" else [args.model]):
        print(json.dumps(measure(model, args.pairs or PAIRS[model])), flush=True)


if __name__ == "__main__":
    main()
