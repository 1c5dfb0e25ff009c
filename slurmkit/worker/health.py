"""The node health gate: one process per node, before any rank starts.

    srun --ntasks-per-node=1 python -m slurmkit.worker.health --run-dir DIR --gpus N

A node fails when it shows a different number of GPUs than the job asked for, a GPU with
uncorrectable ECC errors, or (with --allreduce, the profile's health_allreduce) when a short
all-reduce across the nodes fails or sums wrong. Its reasons go to health-<node>.json in the run folder, the gate exits
non-zero, and the supervisor requeues the job (cause node_failure) with that node excluded.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import HealthReport
from slurmkit.common.ports import health_port
from slurmkit.errors import squash
from slurmkit.worker.gpu import GpuState, query
from slurmkit.worker.process_group import distributed

EXIT_UNHEALTHY = 3


def visible(gpus: list[GpuState], cuda_visible: str | None) -> list[GpuState]:
    """The GPUs this job may use: CUDA_VISIBLE_DEVICES (indices) when Slurm set it, else all listed."""
    if not cuda_visible:
        return gpus
    wanted = {int(i) for i in cuda_visible.split(",") if i.strip().isdigit()}
    return [g for g in gpus if g.index in wanted]


def problems(requested: int, gpus: list[GpuState]) -> list[str]:
    """Why this node must not run the job; empty when it is healthy."""
    found: list[str] = []
    if requested and len(gpus) != requested:
        found.append(f"{len(gpus)} GPUs visible, {requested} requested")
    for g in gpus:
        if g.ecc_uncorrected:
            found.append(f"GPU {g.index} ({g.name}) has {g.ecc_uncorrected} uncorrectable ECC errors")
    return found


def allreduce_problem(timeout_s: float = 60.0) -> str | None:
    """A short all-reduce over the gate's processes (one per node); None when the sum is right."""
    try:
        import torch
        import torch.distributed as tdist

        # Not the training's port: its store must not meet this one, even in TIME_WAIT.
        os.environ.setdefault("MASTER_PORT", str(health_port(os.environ.get("SLURM_JOB_ID", "0"))))
        with distributed(timeout_s) as d:
            t = torch.ones(1 << 18, device=d.device_str)
            if d.world_size > 1:
                tdist.all_reduce(t)
            if int(t[0].item()) != d.world_size or int(t[-1].item()) != d.world_size:
                return f"all-reduce over {d.world_size} nodes returned {t[0].item()}"
    except Exception as exc:  # any failure of the collective is this check's answer
        return f"all-reduce check failed: {squash(str(exc), 240, tail=False)}"
    return None


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or os.uname().nodename


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurmkit.worker.health")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--gpus", type=int, default=0, help="GPUs the job asked for per node")
    parser.add_argument("--allreduce", action="store_true", help="also run a short all-reduce across the nodes")
    args = parser.parse_args(argv)
    gpus, source = query()
    found = problems(args.gpus, visible(gpus, os.environ.get("CUDA_VISIBLE_DEVICES")))
    # The gate's store is signed with the run's secret, from the run folder (slurmkit.worker.signed_store).
    os.environ.setdefault("SLURMKIT_RUN_DIR", args.run_dir)
    if args.allreduce and not found:
        found += [p for p in [allreduce_problem()] if p]
    node = node_name()
    if not found:
        extra = ", all-reduce ok" if args.allreduce else ""
        print(f"slurmkit health: {node} ok ({len(gpus)} GPUs via {source}{extra})", flush=True)
        return 0
    HealthReport(node, found, source, [g.as_dict() for g in gpus]).write(RunPaths(Path(args.run_dir)))
    print(f"slurmkit health: {node} FAILED: {'; '.join(found)}", file=sys.stderr, flush=True)
    return EXIT_UNHEALTHY


if __name__ == "__main__":
    sys.exit(main())
