"""The memory of bad nodes (common.node_ledger): a private file per user and cluster, blame within a
window, and the choice a submit makes from it: the most blamed nodes, as many as the partition spares."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from slurmkit.common.node_ledger import Blame, NodeLedger, exclusion, recent, state_folder
from slurmkit.config.profile import ClusterProfile
from slurmkit.errors import SlurmkitError

DAY = 86400.0


def blame(node: str, age_days: float, cause: str = "health_gate") -> Blame:
    return Blame.model_validate({"node": node, "cause": cause, "time": time.time() - age_days * DAY, "run_id": "r"})


def test_blames_are_kept_per_cluster_in_a_private_file_and_forgotten_one_node_at_a_time(own_node_ledger: Path) -> None:
    ledger = NodeLedger("dev")
    ledger.add([blame("node1", 1), blame("node2", 2, "hang")])
    ledger.add([blame("node1", 0, "lost"), blame("node3", 200)])  # 200 days: older than anything a window reaches
    assert [(b.node, b.cause) for b in NodeLedger("dev").blames()] == [("node1", "health_gate"), ("node2", "hang"),
                                                                        ("node1", "lost")]
    assert NodeLedger("other").blames() == []  # per cluster
    assert os.stat(ledger.path).st_mode & 0o077 == 0 and os.stat(ledger.path.parent).st_mode & 0o777 == 0o700
    assert ledger.forget("node1") == 2 and [b.node for b in ledger.blames()] == ["node2"]


def test_a_state_folder_others_can_write_is_refused(own_node_ledger: Path) -> None:
    folder = state_folder()
    folder.chmod(0o770)
    with pytest.raises(SlurmkitError):
        NodeLedger("dev").add([blame("node1", 0)])


def test_only_blame_within_the_window_counts_most_blamed_first() -> None:
    found = recent([blame("a", 1), blame("b", 2), blame("b", 3), blame("c", 9)], window_s=7 * DAY)
    assert [(n, len(b)) for n, b in found.items()] == [("b", 2), ("a", 1)]


def test_a_submit_excludes_what_is_blamed_enough_but_never_what_the_partition_needs() -> None:
    by_node = recent([blame(n, 1) for n in ("a", "a", "a", "b", "b", "c")], window_s=7 * DAY)
    assert exclusion(by_node, 2, partition_nodes=10, needed=2, already=set()).excluded == ["a", "b"]
    tight = exclusion(by_node, 2, partition_nodes=4, needed=2, already={"z"})  # room for one
    assert (tight.excluded, tight.kept) == (["a"], ["b"])
    assert exclusion(by_node, 0, 10, 2, set()).excluded == []  # exclude_after 0: off


def test_the_profile_window_is_a_number_and_a_unit() -> None:
    assert ClusterProfile.model_validate({"node_ledger": {"window": "12h"}}).node_ledger.window_s == 12 * 3600
    with pytest.raises(ValidationError):
        ClusterProfile.model_validate({"node_ledger": {"window": "7 days"}})
