"""Facts from the Slurm environment that both sides need: this job's id as submitit names its
files, and hostlist expansion in Python, so ranks need no Slurm binaries (most container images
have no scontrol).
"""

from __future__ import annotations

import os
import re

STARTUP_TIMEOUT_ENV = "SLURMKIT_STARTUP_TIMEOUT_S"
"""The profile's startup_timeout_s, as every rank gets it (worker.ft.watchdog.StartupWatch)."""
STRAGGLER_SCORE_ENV = "SLURMKIT_STRAGGLER_SCORE"
"""The profile's straggler_score, as every rank gets it (worker.ft.straggler)."""
STAGED_PYTHON_ENV = "SLURMKIT_STAGED_PYTHON"
"""The node-local copy of the ranks' interpreter, once the batch shell has staged it (profile stage.env)."""


def rank_env(startup_timeout_s: float, straggler_score: float) -> dict[str, str]:
    """What every rank gets from the profile: the batch script exports it on Slurm, the local
    executor sets it for its ranks."""
    return {STARTUP_TIMEOUT_ENV: str(startup_timeout_s), STRAGGLER_SCORE_ENV: str(straggler_score)}


_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+))?$")
# What a job's own environment says about that job, and what slurmkit sets for a run's ranks (its
# run folder, markers, rendezvous, tracker runs): a run started from inside one (a nested pipeline)
# must not hand them to the new one, which would otherwise write the outer run's markers and join
# its rendezvous. SLURM_CONF and the user's own SLURMKIT_PROFILE* settings stay.
JOB_ENV_PREFIXES = ("SLURM_", "SUBMITIT_", "TORCHELASTIC_", "SLURMKIT_")
JOB_ENV_NAMES = frozenset({"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                           "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE", "MLFLOW_RUN_ID", "WANDB_RUN_ID",
                           "WANDB_RESUME", "WANDB_RUN_GROUP", "WANDB_NAME", "WANDB_DIR"})
KEPT_ENV = frozenset({"SLURM_CONF", "SLURMKIT_PROFILE", "SLURMKIT_PROFILE_PATH", "SLURMKIT_DEVCLUSTER_STATE"})


def slurm_job_id() -> str:
    """This job's id as submitit names its files: ARRAYID_TASKID for an array task."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID", "")


def outer_job_env(environ: dict[str, str]) -> list[str]:
    """The variables of the job or run this process runs in (none outside one)."""
    if not {"SLURM_JOB_ID", "SUBMITIT_EXECUTOR", "SLURMKIT_RUN_DIR"} & environ.keys():
        return []
    return sorted(k for k in environ if k not in KEPT_ENV and (k.startswith(JOB_ENV_PREFIXES) or k in JOB_ENV_NAMES))


def base_id(job_id: str) -> str:
    """The job id an array task, a step or a heterogeneous component belongs to: 7_3, 7.0, 7+1 -> 7."""
    return re.split(r"[_.+]", job_id, maxsplit=1)[0]


def _split_top(text: str) -> list[str]:
    """Split on the commas outside brackets: 'a[1-2], b' -> ['a[1-2]', 'b'] (blanks around items
    dropped, as Slurm drops them)."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += (c == "[") - (c == "]")
        if depth < 0:
            raise ValueError(f"unbalanced ']' in hostlist {text!r}")
        if c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced '[' in hostlist {text!r}")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_one(item: str) -> list[str]:
    """'node[01-03,7]x' -> node01x node02x node03x node7x; brackets may repeat ('r[1-2]n[1-2]')."""
    head, sep, rest = item.partition("[")
    if not sep:
        return [item]
    body, close, tail = rest.partition("]")
    if not close:
        raise ValueError(f"unbalanced '[' in hostlist item {item!r}")
    names: list[str] = []
    for rng in body.split(","):
        m = _RANGE_RE.match(rng.strip())
        if not m:
            raise ValueError(f"invalid range {rng!r} in hostlist item {item!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"descending range {rng!r} in hostlist item {item!r}")
        width = len(lo) if lo.startswith("0") else 0  # zero padding is kept, as Slurm does
        names += [f"{head}{n:0{width}d}" for n in range(int(lo), int(hi) + 1)]
    return [f"{name}{t}" for name in names for t in _expand_one(tail)]


def expand_hostlist(hostlist: str) -> list[str]:
    """Every host of a Slurm hostlist ('node[1-3,7],gpu-a[01-02]'), in order, as
    `scontrol show hostnames` prints them."""
    return [host for item in _split_top(hostlist.strip()) for host in _expand_one(item)]
