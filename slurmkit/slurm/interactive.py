"""The interactive Slurm commands: a shell inside a live job (`slurmkit attach`) and a new interactive
allocation with the profile's setup (`slurmkit shell`). They own the user's terminal until the user
leaves them, so they have no timeout but the user's (a queued `salloc` waits until Ctrl-C)."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import NoReturn

from slurmkit import trust
from slurmkit.config.resolved import Resolved

SHELL_JOB_NAME = "slurmkit-shell"


def _srun(launcher: str | None) -> list[str]:
    """srun itself, or the launcher that runs it with the profile's container (render.render_interactive),
    its srun options then `--` then the command."""
    return ["srun"] if launcher is None else ["bash", launcher]


def _command(launcher: str | None, command: list[str]) -> list[str]:
    return command if launcher is None else ["--", *command]


def attach_argv(job_id: str, host: str, chdir: str, shell: str = "bash", launcher: str | None = None) -> list[str]:
    """An interactive shell on `host` inside job `job_id`'s allocation, beside its steps (--overlap),
    on a terminal (--pty), in the run's container when `launcher` is its launcher. The caller's
    environment goes along (srun's --export=ALL)."""
    return [*_srun(launcher), "--overlap", f"--jobid={trust.job_id(job_id, 'job id')}", f"--nodelist={host}", "-N1",
            "-n1", "--pty", f"--chdir={chdir}", *_command(launcher, [shell, "-i"])]


def exec_interactive(argv: list[str], env: dict[str, str]) -> NoReturn:
    """Become `argv`: the terminal is the Slurm command's until the user leaves it."""
    os.execvpe(argv[0], argv, env)


def salloc_argv(resolved: Resolved, rcfile: str, launcher: str | None = None) -> list[str]:
    """`salloc` of the resolved resources with the profile's partition, account, QOS and the rest,
    then one `srun --pty` bash on its first node reading `rcfile` (in the profile's container when
    `launcher` is its launcher). Each value is one argument of its own, `--option=value`, so none can
    read as another option."""
    r, p = resolved.resources, resolved.profile
    values = {"nodes": resolved.shape.alloc_nodes, "ntasks-per-node": r.tasks_per_node,
              "cpus-per-task": r.cpus_per_task,
              "gpus-per-node": r.gpus_per_node, "gpus-per-task": r.gpus_per_task, "gres": r.gres,
              "cpus-per-gpu": r.cpus_per_gpu, "mem": r.mem, "mem-per-gpu": r.mem_per_gpu, "time": r.time,
              "partition": p.partition, "account": p.account, "qos": p.qos, "constraint": p.constraint,
              "exclude": p.exclude, "reservation": p.reservation}
    flags = [f"--{key}={value}" for key, value in values.items() if value]
    return ["salloc", f"--job-name={SHELL_JOB_NAME}", *flags, *_srun(launcher), "--pty", "-N1", "-n1",
            *_command(launcher, ["bash", "--rcfile", rcfile, "-i"])]


def run_interactive(argv: list[str]) -> int:
    """Run `argv` on this terminal and wait; its exit status. Ctrl-C is the Slurm command's to act on
    (salloc passes it on, or gives up waiting in the queue), not a reason for this process to leave."""
    proc = subprocess.Popen(argv)  # started first: it must not inherit the ignored SIGINT
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return proc.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
