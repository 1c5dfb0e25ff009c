"""A memory of bad nodes, per user and cluster, across runs.

Every cause that blames a node is one Blame in the user's own state folder
($XDG_STATE_HOME/slurmkit/nodes/CLUSTER.json, else ~/.local/state/..., the folder 0700 and checked
as it is opened): a node that failed the health gate, a node the job lost, a node whose rank hung.
The job's supervisor writes them as it decides (supervisor.effects); the next submit on the same
cluster reads them and keeps off the nodes blamed at least `exclude_after` times within `window`
(the profile's node_ledger), never so many that the partition can no longer hold the job
(`exclusion`). `slurmkit nodes` lists and forgets them.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from slurmkit import trust
from slurmkit.common.locked import LockedJson, Record
from slurmkit.common.slurm_env import slurm_job_id
from slurmkit.errors import SlurmkitError, squash

BlameCause = Literal["health_gate", "lost", "hang", "crash", "straggler"]
KEEP_S = 90 * 86400
"""Blames older than this are dropped at the next write: no window reaches that far."""


class Blame(BaseModel):
    node: str
    cause: BlameCause
    time: float
    run_id: str = ""
    job_id: str = ""


class Blames(Record):
    blames: list[Blame] = []


def state_folder() -> Path:
    """$XDG_STATE_HOME/slurmkit/nodes (else ~/.local/state/...): made 0700 if missing, and refused
    in one line unless it is the caller's own and reachable by no one else."""
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "slurmkit" / "nodes"
    return trust.private_folder(base, "XDG_STATE_HOME", "your node ledger")


class NodeLedger(LockedJson[Blames]):
    """One cluster's ledger: read, added to and forgotten under its file lock."""

    model = Blames
    missing_error = "no node ledger yet"

    def __init__(self, cluster: str) -> None:
        name = re.sub(r"[^A-Za-z0-9._-]", "_", cluster or "cluster")
        super().__init__(state_folder() / f"{name}.json")

    def blames(self) -> list[Blame]:
        return self.read().blames if self.path.exists() else []

    def add(self, found: Iterable[Blame]) -> None:
        new = list(found)
        if not new:
            return
        with self._locked():
            now = time.time()
            self._save(Blames(blames=[b for b in [*self.blames(), *new] if now - b.time < KEEP_S]))

    def forget(self, node: str) -> int:
        """Drop every blame of `node`; how many there were."""
        with self._locked():
            blames = self.blames()
            kept = [b for b in blames if b.node != node]
            if len(kept) != len(blames):
                self._save(Blames(blames=kept))
            return len(blames) - len(kept)


def blame_here(found: Iterable[tuple[str, BlameCause]], run_id: str) -> None:
    """Blames from inside a job (its supervisor, its rank 0), into the user's ledger of the job's
    cluster (SLURM_CLUSTER_NAME): a ledger that cannot be written costs the run nothing but the
    memory, said in one line."""
    at, job_id = time.time(), slurm_job_id()
    try:
        NodeLedger(os.environ.get("SLURM_CLUSTER_NAME", "")).add(
            Blame(node=node, cause=cause, time=at, run_id=run_id, job_id=job_id) for node, cause in found)
    except (OSError, SlurmkitError) as exc:
        print(f"slurmkit: the node ledger was not written: {squash(str(exc))}", file=sys.stderr, flush=True)


def recent(blames: list[Blame], window_s: float, now: float | None = None) -> dict[str, list[Blame]]:
    """Each node's blames within the window, newest last; nodes most blamed first."""
    since = (time.time() if now is None else now) - window_s
    by_node: dict[str, list[Blame]] = {}
    for b in sorted(blames, key=lambda b: b.time):
        if b.time >= since:
            by_node.setdefault(b.node, []).append(b)
    return dict(sorted(by_node.items(), key=lambda kv: (-len(kv[1]), kv[0])))


def causes(blames: list[Blame]) -> str:
    """`health_gate x2, hang`: what a node was blamed for."""
    return ", ".join(f"{c} x{n}" if n > 1 else c for c, n in Counter(b.cause for b in blames).most_common())


@dataclass(frozen=True)
class Exclusion:
    excluded: list[str]
    """Nodes the submit keeps off (most blamed first)."""
    kept: list[str]
    """Nodes blamed enough, allowed anyway: without them the partition could not hold the job."""


def exclusion(by_node: dict[str, list[Blame]], exclude_after: int, partition_nodes: int, needed: int,
              already: set[str]) -> Exclusion:
    """The nodes blamed at least `exclude_after` times, most blamed first, as many as the partition
    can spare: it keeps `needed` nodes besides those `already` excluded (the profile's)."""
    if exclude_after <= 0:
        return Exclusion([], [])
    bad = [n for n, found in by_node.items() if len(found) >= exclude_after and n not in already]
    room = max(0, partition_nodes - len(already) - needed)
    return Exclusion(bad[:room], bad[room:])
