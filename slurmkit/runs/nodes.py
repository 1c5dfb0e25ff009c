"""`slurmkit nodes`: the user's memory of bad nodes on this cluster (common.node_ledger, its file
named by Slurm's ClusterName), and forgetting one."""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass

from slurmkit.common.node_ledger import NodeLedger, causes, recent
from slurmkit.config.profile import ClusterProfile
from slurmkit.jsontypes import JsonObject
from slurmkit.slurm import commands


@dataclass(frozen=True)
class NodeBlame:
    node: str
    blames: int
    """Within the profile's node_ledger.window."""
    causes: str
    last: str
    """The newest blame's time (ISO, seconds)."""
    runs: list[str]
    excluded: bool
    """The next submit keeps off it (at least node_ledger.exclude_after blames), where the partition can spare it."""

    def as_dict(self) -> JsonObject:
        return asdict(self)


def blamed(profile: ClusterProfile) -> list[NodeBlame]:
    """The nodes blamed within the window, most blamed first."""
    policy = profile.node_ledger
    found = []
    for node, blames in recent(NodeLedger(commands.cluster_name()).blames(), policy.window_s).items():
        last = dt.datetime.fromtimestamp(blames[-1].time).isoformat(timespec="seconds")
        found.append(NodeBlame(node, len(blames), causes(blames), last, sorted({b.run_id for b in blames if b.run_id}),
                               0 < policy.exclude_after <= len(blames)))
    return found


def forget(node: str) -> int:
    """Clear every blame of `node` on this cluster; how many there were."""
    return NodeLedger(commands.cluster_name()).forget(node)
