"""Checks against the live cluster before anything is queued; each refusal is one line."""

from __future__ import annotations

from dataclasses import replace

from slurmkit.common.node_ledger import NodeLedger, causes, exclusion, recent
from slurmkit.common.slurm_env import expand_hostlist
from slurmkit.config.fields import time_to_minutes
from slurmkit.config.resolved import Resolved
from slurmkit.errors import PreflightError, warn
from slurmkit.slurm import commands, imports, limits


def _max_minutes(max_time: str) -> int | None:
    if max_time in ("UNLIMITED", "INFINITE", ""):
        return None
    return time_to_minutes(max_time)


def _partition(resolved: Resolved, partitions: dict[str, dict[str, str]]) -> str:
    """The partition the job goes to: the profile's, else the cluster's default; refused in one line."""
    name = resolved.profile.partition
    if name is None:
        defaults = [p for p, f in partitions.items() if f.get("Default") == "YES"]
        if not defaults:
            raise PreflightError("no partition given and the cluster has no default partition",
                                 where="profile:partition", valid=f"valid: {', '.join(sorted(partitions))}")
        name = defaults[0]
    if name not in partitions:
        raise PreflightError(f"partition '{name}' does not exist on this cluster", where="profile:partition",
                             valid=f"valid: {', '.join(sorted(partitions)) or 'none'}")
    return name


def avoid_blamed(resolved: Resolved) -> Resolved:
    """The request kept off the nodes the user's ledger blames enough on this cluster (the profile's
    node_ledger), as many as the partition can spare, said in one line; unchanged where none is."""
    ledger = resolved.profile.node_ledger
    if ledger.exclude_after == 0:
        return resolved
    by_node = recent(NodeLedger(commands.cluster_name()).blames(), ledger.window_s)
    if not any(len(found) >= ledger.exclude_after for found in by_node.values()):
        return resolved
    partitions = commands.show_partitions()
    total = int(partitions[_partition(resolved, partitions)].get("TotalNodes", "0") or 0)
    already = set(expand_hostlist(resolved.profile.exclude or ""))
    chosen = exclusion(by_node, ledger.exclude_after, total, resolved.shape.alloc_nodes, already)
    if chosen.kept:
        warn(f"node ledger: kept {', '.join(chosen.kept)} (blamed: "
             f"{'; '.join(causes(by_node[n]) for n in chosen.kept)}): without them the partition cannot hold "
             f"{resolved.shape.alloc_nodes} node(s)")
    if not chosen.excluded:
        return resolved
    warn(f"node ledger: excluding {', '.join(f'{n} ({causes(by_node[n])})' for n in chosen.excluded)}; "
         "`slurmkit nodes --forget NODE` clears one")
    nodes = ",".join([*sorted(already), *chosen.excluded])
    return replace(resolved, profile=resolved.profile.model_copy(update={"exclude": nodes}))


def check(resolved: Resolved, array_size: int | None = None) -> str:
    """Raise PreflightError if the job cannot run on the live cluster (a heterogeneous run: each
    part, its field named); return the partition used."""
    for each in resolved.parts:
        try:
            check(each.resolved, array_size)
        except PreflightError as exc:
            where = f"components.{each.name}" + (f".{exc.where}" if exc.where and ":" not in exc.where
                                                  else f" ({exc.where})" if exc.where else "")
            raise PreflightError(exc.what, where=where, valid=exc.valid) from None
    if resolved.parts:
        return _partition(resolved, commands.show_partitions())
    imports.check_ray_importable(resolved)
    imports.check_command_imports(resolved, resolved.spec_source)
    imports.check_storage(resolved)
    imports.check_packages(resolved)
    r = resolved.resources
    partitions = commands.show_partitions()
    name = _partition(resolved, partitions)
    part = partitions[name]
    limit = _max_minutes(part.get("MaxTime", ""))
    assert r.time is not None
    shape = resolved.shape
    if limit is not None and time_to_minutes(r.time) > limit:
        raise PreflightError(f"time {r.time} exceeds partition '{name}' MaxTime={part['MaxTime']}",
                             where="resources.time")
    total_nodes = int(part.get("TotalNodes", "0") or 0)
    asked, where = shape.asked, shape.where
    if shape.alloc_nodes > total_nodes:
        raise PreflightError(f"{asked} exceeds the {total_nodes} nodes of partition '{name}'", where=where)
    max_nodes = part.get("MaxNodes", "UNLIMITED")
    if max_nodes.isdigit() and shape.alloc_nodes > int(max_nodes):
        raise PreflightError(f"{asked} exceeds partition '{name}' MaxNodes={max_nodes}", where=where)
    if resolved.node_gpus:
        gres = commands.partition_gres(name)
        if not any(g.split(":")[0] == "gpu" for g in gres):
            form = next(f for f in ("gpus_per_node", "gpus_per_task", "gres") if getattr(r, f))
            raise PreflightError(
                f"{form}={getattr(r, form)} but partition '{name}' has no GRES gpu",
                where=f"resources.{form}", valid=f"GRES there: {', '.join(gres) or 'none'}")
    limits.check(resolved)
    if array_size is not None:
        max_array = int(commands.show_config().get("MaxArraySize", "1001"))
        if array_size > max_array:
            raise PreflightError(f"array of {array_size} tasks exceeds MaxArraySize={max_array}",
                                 where="array")
    return name
