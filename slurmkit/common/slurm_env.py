"""Facts from the Slurm environment that both sides need: this job's id as submitit names its
files, and hostlist expansion in Python, so ranks need no Slurm binaries (most container images
have no scontrol).
"""

from __future__ import annotations

import os
import re

_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+))?$")


def slurm_job_id() -> str:
    """This job's id as submitit names its files: ARRAYID_TASKID for an array task."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID", "")


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
