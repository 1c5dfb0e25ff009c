"""`slurmkit nodes`: the user's memory of bad nodes on a profile's cluster (common.node_ledger), and
forgetting one."""

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


def ledger(profile: ClusterProfile) -> NodeLedger:
    """The ledger of the profile's cluster (Slurm's ClusterName)."""
    return NodeLedger(commands.show_config().get("ClusterName", ""))


def blamed(profile: ClusterProfile) -> list[NodeBlame]:
    """The nodes blamed within the window, most blamed first."""
    policy = profile.node_ledger
    found = []
    for node, blames in recent(ledger(profile).blames(), policy.window_s).items():
        last = dt.datetime.fromtimestamp(blames[-1].time).isoformat(timespec="seconds")
        found.append(NodeBlame(node, len(blames), causes(blames), last, sorted({b.run_id for b in blames if b.run_id}),
                               0 < policy.exclude_after <= len(blames)))
    return found


def forget(profile: ClusterProfile, node: str) -> int:
    """Clear every blame of `node` on the profile's cluster; how many there were."""
    return ledger(profile).forget(node)
