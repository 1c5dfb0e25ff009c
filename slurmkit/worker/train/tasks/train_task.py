"""`task: train`: the digits classifier or the small GPT, data-parallel over every rank."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from slurmkit.common.layout import RunPaths
from slurmkit.common.metrics import MetricsWriter
from slurmkit.common.record import RunFile
from slurmkit.config.train import TrainConfig
from slurmkit.jsontypes import JsonObject
from slurmkit.worker import rank, startup, tracking
from slurmkit.worker.ft import straggler
from slurmkit.worker.gpu import GpuSampler
from slurmkit.worker.process_group import Dist, distributed
from slurmkit.worker.train import fast_paths, incarnation
from slurmkit.worker.train.fast_paths import FastPaths
from slurmkit.worker.train.flops import peak_flops
from slurmkit.worker.train.tasks import digits, gpt
from slurmkit.worker.train.trainer import Trainer, TrainerOptions, parallelize, warmup_cosine


def _dtype(cfg: TrainConfig, dist: Dist) -> torch.dtype | None:
    if cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and dist.device_str.startswith("cuda")):
        return torch.bfloat16
    return None


def build(cfg: TrainConfig, dist: Dist, run_dir: Path | None) -> tuple[Trainer, JsonObject]:
    """The Trainer for cfg, and the task's extras (evaluation data, peak source)."""
    torch.manual_seed(cfg.seed)  # same init on every rank; DDP also broadcasts rank 0's
    extras: JsonObject = {}
    if cfg.model == "digits":
        train_set, test_set = digits.data()
        net: torch.nn.Module = digits.model(cfg)
        per_sample, tokens, loss = digits.flops_per_sample(net), 0, digits.loss_fn
        extras["test_set"] = test_set
    else:
        train_set = gpt.data(cfg)
        gnet = gpt.GPT(cfg)
        net, tokens, loss = gnet, cfg.seq_len, gpt.loss_fn
        per_sample = gpt.flops_per_token(gnet, cfg) * cfg.seq_len
    device_name = torch.cuda.get_device_name() if dist.device_str.startswith("cuda") else None
    peak, source = peak_flops(device_name, torch.get_num_threads(), cfg.peak_flops)
    extras["peak_flops"], extras["peak_source"] = peak, source
    compute_dtype = _dtype(cfg, dist)
    net = parallelize(net, cfg.parallel, dist.device_str, FastPaths.of(cfg, compute_dtype))
    fused = cfg.fused_optimizer if cfg.fused_optimizer is not None else dist.device_str.startswith("cuda")
    optimizer = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, fused=fused or None)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(cfg.steps))
    metrics = MetricsWriter(RunPaths(run_dir).metrics if run_dir else None, dist.is_main)
    options = TrainerOptions(steps=cfg.steps, micro_batch=cfg.per_rank_batch(dist.world_size),
                             grad_accum=cfg.grad_accum, seed=cfg.seed, flops_per_sample=per_sample,
                             tokens_per_sample=tokens, peak_flops=peak, log_every=cfg.metrics_cadence[0],
                             log_min_interval_s=cfg.metrics_cadence[1],
                             autocast_dtype=compute_dtype, parallel=cfg.parallel,
                             ddp_static_graph=cfg.ddp_static_graph, ddp_bucket_mb=cfg.ddp_bucket_mb)
    trainer = Trainer(net, optimizer, train_set, loss, dist, options, scheduler=scheduler, metrics=metrics)
    return trainer, extras


def _report(summary: JsonObject, trainer: Trainer, dist: Dist, extras: JsonObject) -> None:
    """The test accuracy where the task has a test set; rank 0 prints the run's figures."""
    if "test_set" in extras:
        summary["accuracy"] = digits.accuracy(trainer.raw_model, extras["test_set"], trainer.device)
    if dist.is_main:
        shown = {k: summary[k] for k in ("steps", "loss", "accuracy", "samples_per_s", "mfu", "restarts")
                 if k in summary}
        print(f"slurmkit train: done {json.dumps(shown)}", flush=True)


def run(config: Mapping[str, object], run_dir: str | None = None) -> JsonObject:
    """Train on every rank; each rank returns the summary (with its own parameter digest)."""
    cfg = TrainConfig.model_validate(config)
    _compile_cache(cfg, run_dir)
    prefetch = incarnation.start_prefetch(run_dir, cfg.parallel) if cfg.prefetch_checkpoint else None
    startup.mark("imports")
    with distributed() as dist:
        startup.mark("rendezvous")
        trainer, extras = build(cfg, dist, Path(run_dir) if run_dir else None)
        startup.mark("build")
        life = incarnation.Incarnation(dist, run_dir, cfg, prefetch)
        life.attach(trainer)
        startup.mark("restore")
        trainer.hooks.append(startup.first_step_hook)
        if dist.is_main:
            print(f"slurmkit train: model={cfg.model} world_size={dist.world_size} backend={dist.backend} "
                  f"global_batch={trainer.global_batch} peak={extras['peak_flops']:.3g} ({extras['peak_source']})",
                  flush=True)
        pace = straggler.sharing(dist, run_dir)
        if pace is not None and pace.namer is not None:
            trainer.hooks.append(pace.namer.hook)
        watchers = [w for w in (_gpu_sampler(cfg, dist, run_dir), pace) if w is not None]
        trackers = _trackers(trainer, dist, run_dir, life.resumed_step)
        t0 = time.perf_counter()
        try:
            summary = life.fit(trainer)
            life.finish()
        finally:
            life.close()
            trainer.metrics.close()
            for watcher in watchers:
                watcher.stop()
            if trackers is not None and (life.stopped or sys.exc_info()[0] is not None):
                trackers.close()  # the tracker run goes on in the next incarnation
        if life.stopped:
            life.stop_and_exit(trainer)  # does not return
        summary.update(model=cfg.model, rank=dist.rank, peak_flops=extras["peak_flops"],
                       peak_source=extras["peak_source"], wall_s=time.perf_counter() - t0, **life.summary(),
                       **({"compile_s": startup.compile_seconds()} if cfg.compile else {}))
        if trackers is not None:
            trackers.finish(summary)
            trackers.close()
        _report(summary, trainer, dist, extras)
    # Past the group's teardown only returns are left (the trainer's objects freed, the outcome and
    # submitit's result written). CI saw rank 1 never get to its exit from here, its group gone and
    # rank 0 done, the job RUNNING with every step done: should that recur, its stacks are logged.
    rank.watch_the_way_out()
    return summary


def _compile_cache(cfg: TrainConfig, run_dir: str | None) -> None:
    """With config.compile, inductor's caches where the profile keeps this run's compiled code (a
    folder without run.json: its own), set before anything compiles."""
    if not (cfg.compile and run_dir):
        return
    paths = RunPaths(Path(run_dir))
    record = RunFile(paths).read() if paths.record.exists() else None
    fast_paths.compile_cache(fast_paths.cache_folder(paths, record.profile.compile_cache, record.run_id)
                             if record is not None else paths.compile_cache)


def _trackers(trainer: Trainer, dist: Dist, run_dir: str | None, resumed: int | None) -> tracking.Trackers | None:
    """Rank 0's trackers (profile or spec `tracking:`), fed every metrics record; None without any."""
    if not run_dir or not dist.is_main:
        return None
    trackers = tracking.Trackers.open(run_dir, resumed)
    if trackers is not None:
        trainer.metrics.sinks.append(trackers.record)
        tracking.activate(trackers)  # slurmkit.tracking.log() in hooks goes to the same runs
    return trackers


def _gpu_sampler(cfg: TrainConfig, dist: Dist, run_dir: str | None) -> Any:
    """On each node's first rank, sample its GPUs into the run folder; None without GPUs (silently)."""
    if not run_dir or dist.env.local_rank != 0 or cfg.gpu_sample_s <= 0:
        return None

    sampler = GpuSampler(RunPaths(Path(run_dir)).gpu_metrics(os.uname().nodename), cfg.gpu_sample_s)
    return sampler if sampler.start() else None
