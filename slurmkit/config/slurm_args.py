"""`srun_args` and `sbatch_args`: Slurm options slurmkit has no field for, in a profile or a run spec
(submitit's `slurm_srun_args` and `slurm_additional_parameters`). An option slurmkit sets itself, or
has a field for, is refused in one line naming that field: two values for one option would fight.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator

from slurmkit.config.fields import SbatchOptions, sbatch_safe
from slurmkit.config.text import clip

_OPTION = re.compile(r"^--([a-z][a-z0-9-]*)(=.+)?$", re.DOTALL)
_NAME = re.compile(r"^[a-z][a-z0-9-]+$")  # long names: a one-letter key is an abbreviation

SLURMKIT_OWNS = {
    "output": "slurmkit's logs (`slurmkit logs RUN`)", "error": "slurmkit's logs (`slurmkit logs RUN`)",
    "open-mode": "slurmkit's logs", "array": "sweep (docs/sweeps.md)", "signal": "signal and signal_delay_s",
    "requeue": "requeue", "no-requeue": "requeue", "nodes": "resources.nodes", "ntasks": "resources.tasks_per_node",
    "ntasks-per-node": "resources.tasks_per_node", "cpus-per-task": "resources.cpus_per_task",
    "cpus-per-gpu": "resources.cpus_per_gpu", "gpus-per-node": "resources.gpus_per_node",
    "gpus-per-task": "resources.gpus_per_task", "gres": "resources.gres", "mem": "resources.mem",
    "mem-per-gpu": "resources.mem_per_gpu", "time": "resources.time", "partition": "partition",
    "account": "account", "qos": "qos", "constraint": "constraint", "exclude": "exclude",
    "reservation": "reservation", "job-name": "name", "dependency": "`submit --after RUN`",
    "export": "env and secret_env", "wrap": "command", "chdir": "the folder you submit from",
    "kill-on-bad-exit": "requeue.in_job (slurmkit's supervisor decides what a failed rank means)",
    "overlap": "slurmkit's standby ranks", "no-kill": "resources.spare_nodes or resources.elastic",
    "container-image": "container.image", "container-mounts": "container.mounts",
    "unbuffered": "nothing: slurmkit's steps are unbuffered already", "pty": "`slurmkit shell`",
}
"""sbatch options slurmkit sets itself or has a field for, and that field."""
SRUN_OWNS = {k: v for k, v in SLURMKIT_OWNS.items() if k in (
    "output", "error", "open-mode", "nodes", "ntasks", "ntasks-per-node", "cpus-per-task", "exclude", "export",
    "kill-on-bad-exit", "overlap", "container-image", "container-mounts", "unbuffered", "pty", "signal")}
"""srun options of the ranks' step that slurmkit sets itself or has a field for (a step may be named, bound...)."""


OWN_NAMES_BELOW_OWNED = frozenset({"gpus", "container"})
"""sbatch and srun options whose whole name begins an option slurmkit owns (`--gpus`, `--container`):
getopt_long takes an exact name as itself, so these are not abbreviations (checked against the
real sbatch and srun --help in tests/cluster/test_cluster_sbatch_parser.py)."""


def owner_of(name: str, owns: dict[str, str]) -> str | None:
    """The option slurmkit owns that `--name` reaches: itself, or one it abbreviates. sbatch and srun
    take any unambiguous prefix of a long option (getopt_long: `--ou` is `--output`, `--sig` is
    `--signal`), so a prefix of an owned name is refused too, unless it is an option's whole name."""
    if name in owns:
        return name
    if name in OWN_NAMES_BELOW_OWNED:
        return None
    return next((o for o in sorted(owns) if o.startswith(name)), None)


def _owned(name: str, field: str, owns: dict[str, str]) -> None:
    if (owned := owner_of(name, owns)) is not None:
        short = "" if owned == name else f" (an abbreviation of --{owned}: sbatch and srun take any prefix)"
        raise ValueError(f"--{name} is slurmkit's own in {field}{short}; valid: {owns[owned]}")


def _srun_args(value: list[str]) -> list[str]:
    for arg in value:
        m = _OPTION.match(arg)
        if not m:
            raise ValueError(f"{clip(arg)} is not one srun option; valid: --key=value or --flag, one an item")
        _owned(m.group(1), "srun_args", SRUN_OWNS)
    return value


def _sbatch_keys(value: object) -> Any:
    """submitit's spelling too: `mail_type` is `mail-type`; a leading `--` is dropped."""
    if isinstance(value, dict):
        return {str(k).removeprefix("--").replace("_", "-"): v for k, v in value.items()}
    return value


def _sbatch_args(value: dict[str, str | int | bool]) -> dict[str, str | int | bool]:
    for name, item in value.items():
        if not _NAME.match(name):
            raise ValueError(f"{clip(name)} is not an sbatch option's name; valid: e.g. mail-type, comment")
        _owned(name, "sbatch_args", SLURMKIT_OWNS)
        if item is False:
            raise ValueError(f"{name}: false; valid: true for a flag (e.g. exclusive: true), or a value")
        sbatch_safe(str(item))
    return value


def sbatch_lines(args: dict[str, str | int | bool]) -> list[str]:
    """Each as sbatch takes it: --flag for true, else --key=value."""
    return [f"--{k}" if v is True else f"--{k}={v}" for k, v in args.items()]


def _sbatch_extra(value: list[str]) -> list[str]:
    for opt in value:
        if m := _OPTION.match(opt):
            _owned(m.group(1), "sbatch_extra", SLURMKIT_OWNS)
    return value


SrunArgs = Annotated[list[str], AfterValidator(_srun_args)]
SbatchExtra = Annotated[SbatchOptions, AfterValidator(_sbatch_extra)]
"""`sbatch_extra`: the older list form of sbatch_args, held to the same owned options."""
SbatchArgs = Annotated[dict[str, str | int | bool], BeforeValidator(_sbatch_keys), AfterValidator(_sbatch_args)]
