"""The srun steps of a job, as the supervisor (slurmkit.supervisor.loop) starts them on the batch
host: the ranks, the standby ranks beside them, torchrun per node, the health gate.

These are the job's own work, so they have no timeout of their own: the job's time limit bounds
them, and the supervisor passes Slurm's signal on to them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field

from slurmkit.common.slurm_env import STAGED_PYTHON_ENV
from slurmkit.common.supervisor_plan import Plan
from slurmkit.slurm.commands import CALLS


@dataclass(frozen=True)
class Container:
    """The container parts the batch shell built (templates/partials/container/*): srun options
    (pyxis), or a prefix each rank's command runs under (apptainer, docker)."""

    srun_options: list[str] = field(default_factory=list)
    rank_prefix: list[str] = field(default_factory=list)
    parts: dict[int, Container] = field(default_factory=dict)
    """A heterogeneous job's: each part's own, by het group (a part without a container has none)."""

    def of_part(self, group: int) -> Container:
        return self.parts.get(group, Container())


def _logs(plan: Plan, torchrun: bool = False) -> list[str]:
    out, err = plan.stdout, plan.stderr
    if torchrun:  # torchrun's own output: one file per node; each rank logs where submitit logs that rank
        out, err = out.replace("%t", "node%n_torchrun"), err.replace("%t", "node%n_torchrun")
    return [f"--output={out}", f"--error={err}"]


def ranks(plan: Plan, container: Container, nodes: int | None = None, exclude: tuple[str, ...] = ()) -> list[str]:
    """One step of the ranks; `nodes` (a job that shrinks) the nodes it runs on, minus `exclude`."""
    argv = ["srun", "--unbuffered", "--kill-on-bad-exit=1", *_logs(plan, plan.launcher == "torchrun")]
    if plan.launcher == "torchrun":
        per_task = int(os.environ.get("SLURM_CPUS_PER_TASK") or 1)
        argv += [f"--ntasks={os.environ.get('SLURM_JOB_NUM_NODES', '1')}", "--ntasks-per-node=1",
                 f"--cpus-per-task={per_task * plan.tasks_per_node}"]
    elif nodes is not None:
        argv += [f"--nodes={nodes}", f"--ntasks={nodes * plan.tasks_per_node}"]
        if exclude:
            argv.append(f"--exclude={','.join(exclude)}")
    return staged(plan, [*argv, *plan.srun_args, *container.srun_options, *container.rank_prefix, *plan.command])


def part(plan: Plan, group: int, container: Container, job_id: str) -> list[str]:
    """Part `group` of a heterogeneous job (plan.parts): its ranks' step on its own het component.
    Its logs name the job's own id: Slurm's %j there is the component's id (JOB+N)."""
    argv = ranks(plan.part(group), container.of_part(group))
    argv = [a.replace("%j", job_id) if a.startswith(("--output=", "--error=")) else a for a in argv]
    return [argv[0], f"--het-group={group}", *argv[1:]]


def standby(plan: Plan, run_dir: str, attempt: int) -> list[str]:
    """The standby ranks for in-job attempt `attempt`, beside the running step (--overlap: they share its CPUs)."""
    assert plan.standby is not None
    return staged(plan, ["srun", "--overlap", "--unbuffered", "--kill-on-bad-exit=1", *_logs(plan), *plan.srun_args,
                         *plan.standby, "--run-dir", run_dir, "--attempt", str(attempt)])


def health(plan: Plan, run_dir: str) -> list[str]:
    """The health gate: one check per node, each on one CPU; a failing node does not kill the others."""
    assert plan.health is not None
    h = plan.health
    return staged(plan, ["srun", "--ntasks-per-node=1", f"--ntasks={os.environ.get('SLURM_JOB_NUM_NODES', '1')}",
                         "--cpus-per-task=1", "--kill-on-bad-exit=0", *h.python, "-m", "slurmkit.worker.health",
                         "--run-dir", run_dir, "--gpus", str(h.gpus), *(["--allreduce"] if h.allreduce else [])])


def staged(plan: Plan, argv: list[str]) -> list[str]:
    """`argv` with the staged interpreter where the plan's was, once the batch shell has staged the
    environment (profile stage.env: templates/partials/stage.sh.j2 exports it)."""
    copy = os.environ.get(STAGED_PYTHON_ENV)
    if plan.staged_from is None or not copy:
        return argv
    return [copy if a == plan.staged_from else a for a in argv]


def start(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a step with the caller's environment (and `env` over it); the caller waits for it (and
    passes signals on)."""
    CALLS[argv[0]] += 1
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, env={**os.environ, **env} if env else None)


def end(proc: subprocess.Popen[bytes]) -> None:
    """End a step whose tasks cannot end it themselves (frozen): two SIGINTs within a second make
    srun send SIGCONT, SIGTERM and, KillWait later, SIGKILL to every task (srun(1), "Signals"),
    which reaches a stopped process too. The caller goes on waiting for srun to exit."""
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
