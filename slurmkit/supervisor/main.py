"""`python -P -m slurmkit.supervisor`'s arguments, and which supervisor runs the job: the one step's
(supervisor.loop), or a heterogeneous job's parts' (supervisor.parts)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from slurmkit.common import outcomes
from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import Stopped
from slurmkit.common.slurm_env import slurm_job_id
from slurmkit.common.supervisor_plan import Plan
from slurmkit.slurm.steps import Container
from slurmkit.supervisor import effects
from slurmkit.supervisor.loop import Supervisor, after_stop, decide, say
from slurmkit.supervisor.parts import PartsSupervisor


def container_parts(tail: list[str]) -> Container:
    """The batch shell's container arrays, passed after `--` as NAME COUNT ITEM... groups (an item
    may itself look like an option, or be `--`); a heterogeneous job's part N's as NAME-N."""
    found: dict[tuple[str, int | None], list[str]] = {}
    i = 0
    while i < len(tail):
        name, count = tail[i], int(tail[i + 1])
        kind, _, group = name.rpartition("-") if name[-1:].isdigit() else (name, "", "")
        if kind not in ("srun-options", "rank-prefix"):
            raise ValueError(f"unknown container part {name!r}")
        found[kind, int(group) if group else None] = tail[i + 2:i + 2 + count]
        i += 2 + count
    groups = {g for _, g in found if g is not None}
    parts = {g: Container(found.get(("srun-options", g), []), found.get(("rank-prefix", g), [])) for g in groups}
    return Container(found.get(("srun-options", None), []), found.get(("rank-prefix", None), []), parts)


def parse(argv: list[str]) -> tuple[Path, Plan, Container]:
    """The run folder, the plan and the container parts, from the batch script's exec line."""
    head, tail = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="python -m slurmkit.supervisor")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--plan", required=True, help="the plan as JSON (slurmkit.common.supervisor_plan.Plan)")
    parsed = parser.parse_args(head)
    return Path(parsed.run_dir), Plan.model_validate_json(parsed.plan), container_parts(tail)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    job_id = slurm_job_id()
    if not job_id:
        say("the supervisor runs inside a Slurm job only")
        return 2
    if args[2:3] == ["--stage-failed"]:  # the batch shell: some node could not stage (its health report)
        decide(RunPaths(Path(args[1])), job_id, lambda: effects.health_failed(RunPaths(Path(args[1]))))
        return 1
    if args[:1] == ["--after-stop"]:  # a Ray run's batch shell, once its driver's step ended
        paths = RunPaths(Path(args[1]))
        stopped = Stopped.read(paths, job_id, outcomes.restart_count(), 0)
        if stopped is not None:
            after_stop(paths, job_id, stopped)
        return 0
    run_dir, plan, container = parse(args)
    if plan.parts:
        return PartsSupervisor(plan, RunPaths(run_dir), job_id, container).run()
    return Supervisor(plan, RunPaths(run_dir), job_id, container).run()
