"""What keeps a job pending forever, and the user's share: the QOS limits of the user's association
and their fairshare, from accounting (sacctmgr, sshare). Without accounting there are none to read,
and nothing is refused for it.
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass, field

from slurmkit.config.fields import time_to_minutes
from slurmkit.config.resolved import Resolved
from slurmkit.errors import PreflightError, SlurmError
from slurmkit.slurm import commands

TRES_KEYS = ("node", "cpu", "gres/gpu")
"""The TRES a job's request names, and so a limit on them can be checked before it queues."""


def parse_tres(text: str) -> dict[str, int]:
    """'cpu=8,node=1,gres/gpu=4' -> {'cpu': 8, 'node': 1, 'gres/gpu': 4}; a typed gres (gres/gpu:a100=2)
    counts toward gres/gpu; memory and other TRES are left out."""
    found: dict[str, int] = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        name = "gres/gpu" if name.startswith("gres/gpu:") else name
        if name in TRES_KEYS and value.isdigit():
            found[name] = found.get(name, 0) + int(value)
    return found


@dataclass(frozen=True)
class Qos:
    name: str
    per_job: dict[str, int] = field(default_factory=dict)
    """MaxTRES (MaxTRESPerJob): a job over it pends forever (QOSMaxNodePerJobLimit, QOSMaxGRESPerJob)."""
    per_user: dict[str, int] = field(default_factory=dict)
    """MaxTRESPU (MaxTRESPerUser): a job alone over it pends forever (QOSMaxGRESPerUser, ...)."""
    max_wall: str = ""
    """MaxWall: a longer time limit pends forever (QOSMaxWallDurationPerJobLimit)."""


def _query(argv: list[str]) -> list[list[str]]:
    return [line.split("|") for line in commands.run(argv, query=True).splitlines() if line.strip()]


def qos_of(user: str, asked: str | None) -> Qos | None:
    """The QOS a job of `user` runs under (the one asked for, else the association's default) with its
    limits; None where accounting has no answer."""
    try:
        assocs = _query(["sacctmgr", "-n", "-P", "show", "assoc", f"user={user}", "format=QOS,DefaultQOS"])
        name = asked or next((d for _, d in assocs if d), "") or next((q.split(",")[0] for q, _ in assocs if q), "")
        if not name:
            return None
        rows = _query(["sacctmgr", "-n", "-P", "show", "qos", name, "format=Name,MaxTRES,MaxTRESPU,MaxWall"])
    except SlurmError:
        return None
    for qname, per_job, per_user, wall in ((r + [""] * 4)[:4] for r in rows):
        if qname == name:
            return Qos(name, parse_tres(per_job), parse_tres(per_user), wall)
    return None


def fairshare(user: str) -> float | None:
    """The user's FairShare factor (0 to 1: lower waits longer), or None without accounting."""
    try:
        rows = _query(["sshare", "-n", "-P", "-U", "-u", user, "-o", "User,FairShare"])
    except SlurmError:
        return None
    values = [float(f) for u, f, *_ in rows if u == user and f.replace(".", "", 1).isdigit()]
    return min(values) if values else None


def asked_tres(resolved: Resolved) -> dict[str, int]:
    """What one job of the run asks for, in TRES terms."""
    r = resolved.resources
    tasks = resolved.shape.tasks_per_node * resolved.shape.alloc_nodes
    return {"node": resolved.shape.alloc_nodes, "cpu": tasks * (r.cpus_per_task or 1),
            "gres/gpu": resolved.node_gpus * resolved.shape.alloc_nodes}


WHERE = {"node": "resources.nodes", "cpu": "resources.cpus_per_task", "gres/gpu": "resources.gpus_per_node"}


def check(resolved: Resolved, user: str | None = None) -> Qos | None:
    """Refuse, in one line, a job the QOS would keep pending forever: over its per-job or per-user TRES
    limits, or its MaxWall. The QOS it was checked against, or None without accounting."""
    qos = qos_of(user or getpass.getuser(), resolved.profile.qos)
    if qos is None:
        return None
    asked = asked_tres(resolved)
    for limits, kind in ((qos.per_job, "MaxTRESPerJob"), (qos.per_user, "MaxTRESPerUser")):
        for key, limit in limits.items():
            if asked.get(key, 0) > limit:
                raise PreflightError(f"the job asks for {key}={asked[key]}, over QOS '{qos.name}' {kind} "
                                     f"{key}={limit}: it would pend forever", where=WHERE[key],
                                     valid=f"valid: {key} <= {limit}, or another QOS (profile:qos)")
    time = resolved.resources.time
    wall = time_to_minutes(qos.max_wall) if qos.max_wall not in ("", "UNLIMITED", "INFINITE") else 0
    if wall and time and time_to_minutes(time) > wall:
        raise PreflightError(f"time {time} is over QOS '{qos.name}' MaxWall={qos.max_wall}: it would pend forever",
                             where="resources.time", valid=f"valid: <= {qos.max_wall}")
    return qos
