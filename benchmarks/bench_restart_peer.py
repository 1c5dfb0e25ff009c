"""A preempted run back at its first step, slurmkit against the submitit pattern (cluster), back to
back on the dev cluster, from the same environment: 2 nodes x 1 rank, gloo, a small MLP.

- slurmkit: the digits example (`task: train`), `scancel --signal=USR2` at step 20; from the
  requeued incarnation's start (sacct) to the end of its first step, with the start-up phases of
  that step's record (launch, imports, rendezvous, build, restore, first_step).
- the peer: the usual submitit pattern (shared/notes/preemption-facts.md): a `Checkpointable`
  whose ranks init torch.distributed from submitit's environment, rank 0 saving every 10 steps
  with `torch.save`; submitit's own USR2 handler checkpoints and requeues. The same two points.

Alternating pairs (--pairs), medians; the ratio slurmkit / peer. Goal: <= 1.0 (issue 63). Run
with --stage to submit slurmkit's run with profile stage.env (the nodes' copies made first).

    python benchmarks/bench_restart_peer.py [--pairs 2] [--stage]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import submitit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from slurmkit.common.layout import RunPaths  # noqa: E402
from slurmkit.common.metrics import read_records  # noqa: E402
from slurmkit.insight import goodput  # noqa: E402
from slurmkit.load.loader import resolve  # noqa: E402
from slurmkit.runs import jobs  # noqa: E402
from slurmkit.slurm.parse import Incarnation  # noqa: E402

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_digits.yaml"
PREEMPT_AT = 20
EXTRA: list[str] = []


class PeerTrain(submitit.helpers.Checkpointable):
    """The submitit pattern: DDP over gloo from submitit's environment; rank 0 saves every 10 steps
    and logs each step (its time, and which start of the job it is) to `log`."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __call__(self) -> None:
        import torch
        import torch.distributed as dist
        from torch import nn

        submitit.helpers.TorchDistributedEnvironment().export()
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)))
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        ckpt, start = Path(self.folder) / "peer.pt", 0
        if ckpt.exists():
            state = torch.load(ckpt, weights_only=False)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            start = state["step"]
        restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        for step in range(start + 1, 100_000):
            g = torch.Generator().manual_seed(step * 100 + rank)
            x, y = torch.randn(64, 64, generator=g), torch.randint(0, 10, (64,), generator=g)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            time.sleep(0.05)
            if rank == 0:
                with open(Path(self.folder) / "steps.jsonl", "a") as fh:
                    fh.write(json.dumps({"step": step, "time": time.time(), "restart": restart}) + "\n")
                if step % 10 == 0:
                    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt)


def second_start(job_id: str, timeout_s: float = 300) -> Incarnation:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        incs = [i for i in goodput.incarnations([job_id]) if i.start]
        if len(incs) >= 2:
            return incs[1]
        time.sleep(1)
    raise TimeoutError("no second incarnation")


def wait_for(check: Any, timeout_s: float = 300) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.5)
    raise TimeoutError(str(check))


def slurmkit_restart(profile: str, root: str, stage: bool) -> tuple[float, dict[str, float]]:
    sets = ["resources.nodes=2", "resources.tasks_per_node=1", "config.steps=100000", "config.checkpoint_every=10",
            "config.log_every=1", "config.log_min_interval_s=0", f"profile.run_root={root}",
            f"profile.stage.env={str(stage).lower()}", *EXTRA]
    sub = jobs.submit(resolve(EXAMPLE, profile, sets))
    paths, job = RunPaths(Path(sub.run_dir)), sub.job_id or ""
    try:
        wait_for(lambda: any(r.get("step", 0) >= PREEMPT_AT for r in read_records(paths.metrics))
                 if paths.metrics.exists() else False)
        subprocess.run(["scancel", "--signal=USR2", job], check=True)
        inc = second_start(job)
        first = wait_for(lambda: next((r for r in read_records(paths.metrics)
                                       if "startup" in r and float(r["startup"]["process_start"]) >= (inc.start or 0)),
                                      None))
        return float(first["time"]) - (inc.start or 0.0), goodput.startup_spans(inc, first["startup"])
    finally:
        jobs.cancel(paths)


def peer_restart(folder: Path) -> float:
    ex = submitit.AutoExecutor(folder=str(folder / "submitit"), cluster="slurm")
    ex.update_parameters(slurm_partition="debug", nodes=2, tasks_per_node=1, cpus_per_task=1, mem_gb=1,
                         timeout_min=20)
    job = ex.submit(PeerTrain(str(folder)))
    log = folder / "steps.jsonl"
    try:
        wait_for(lambda: log.exists() and any(r["step"] >= PREEMPT_AT for r in read_records(log)))
        subprocess.run(["scancel", "--signal=USR2", str(job.job_id)], check=True)
        inc = second_start(str(job.job_id))
        first = wait_for(lambda: next((r for r in read_records(log) if r["restart"] >= 1), None))
        return float(first["time"]) - (inc.start or 0.0)
    finally:
        job.cancel()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", default="devcluster")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--stage", action="store_true")
    parser.add_argument("--set", action="append", default=[], help="more slurmkit --set overrides")
    args = parser.parse_args()
    EXTRA.extend(args.set)
    ours, peers, phases = [], [], []
    for _ in range(args.pairs):
        root = tempfile.mkdtemp(prefix="bench-peer-")
        took, spans = slurmkit_restart(args.profile, root, args.stage)
        ours.append(took)
        phases.append(spans)
        peers.append(peer_restart(Path(tempfile.mkdtemp(prefix="bench-peer-submitit-"))))
        print(f"slurmkit {took:.2f} s ({spans}); peer {peers[-1]:.2f} s", flush=True)
    median = {k: round(statistics.median(p.get(k, 0.0) for p in phases), 2) for k in phases[0]}
    print(f"requeued incarnation's start to its first step's end: slurmkit {statistics.median(ours):.2f} s, "
          f"the submitit pattern {statistics.median(peers):.2f} s: ratio "
          f"{statistics.median(ours) / statistics.median(peers):.2f} (goal: <= 1.0); slurmkit's phases {median}")


if __name__ == "__main__":
    main()
