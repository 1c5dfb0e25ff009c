"""Straggler scores (worker.ft.straggler): the score of each rank, who is named and when, and two
ranks sharing their medians over a real signed store, rank 0 naming the slow one."""

from __future__ import annotations

import datetime as dt
import secrets
from pathlib import Path

import pytest

from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import Straggler, Stragglers
from slurmkit.common.metrics import iter_records
from slurmkit.common.node_ledger import NodeLedger
from slurmkit.common.ports import free_local_port
from slurmkit.worker.ft.straggler import OwnTime, Pace, Sharing, Watch, scores
from tests import helpers_fns
from tests.conftest import wait_until


def paces(*medians: float) -> list[Pace]:
    return [Pace(rank, f"node{rank + 1}", m) for rank, m in enumerate(medians)]


def test_the_fastest_rank_scores_one_and_a_rank_three_times_slower_a_third() -> None:
    assert scores(paces(0.1, 0.3, 0.1)) == {0: 1.0, 1: pytest.approx(1 / 3), 2: 1.0}


def test_a_rank_is_named_after_three_readings_below_the_score_and_no_longer_once_it_recovers() -> None:
    watch = Watch(0.7)
    assert watch.update(paces(0.1, 0.3), 1.0) == [] and watch.update(paces(0.1, 0.3), 2.0) == []
    (named,) = watch.update(paces(0.1, 0.3), 3.0)
    assert (named.rank, named.node, named.score, named.since) == (1, "node2", pytest.approx(0.333, abs=1e-3), 1.0)
    assert watch.update(paces(0.1, 0.12), 4.0) == []  # back above 0.7: not named, and counting again
    assert watch.update(paces(0.1, 0.3), 5.0) == [] and watch.update(paces(0.1, 0.3), 6.0) == []
    assert [s.since for s in watch.update(paces(0.1, 0.3), 7.0)] == [5.0]  # since its first reading below


def test_a_slow_moment_does_not_name_anyone() -> None:
    watch = Watch(0.7)
    found = [watch.update(paces(0.1, 0.3 if reading % 2 else 0.1), float(reading)) for reading in range(10)]
    assert found == [[]] * 10


def test_rank_0_names_the_slow_rank_from_the_medians_shared_on_the_run_store(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmkit.worker.signed_store import tcp_store

    monkeypatch.setenv("SLURMKIT_STRAGGLER_PERIOD_S", "0.05")
    store = tcp_store("127.0.0.1", free_local_port(), 1, True, dt.timedelta(seconds=30), secrets.token_bytes(32))
    fast, slow = OwnTime(), OwnTime()
    for _ in range(10):
        fast.add(0.1)
        slow.add(0.35)
    paths = RunPaths(tmp_path)
    Stragglers([Straggler(5, "node9", 0.1, 1.0)]).write(paths)  # an older step's
    ranks = [Sharing(store, 0, 2, str(tmp_path), own=fast).start(), Sharing(store, 1, 2, None, own=slow).start()]
    try:
        assert Stragglers.read(paths) == []  # emptied as rank 0 starts sharing: it names this step's ranks
        wait_until(lambda: Stragglers.read(paths) != [], 60, "rank 1 named")
    finally:
        for sharing in ranks:
            sharing.stop()
    (named,) = Stragglers.read(paths)
    assert (named.rank, named.score) == (1, pytest.approx(0.286, abs=1e-3))
    readings = list(iter_records(paths.straggler_scores))  # over time: every reading, the slowest first
    assert len(readings) >= 3 and all(r["slowest"][0][0] == 1 for r in readings)
    record: dict[str, object] = {}
    assert ranks[0].namer is not None and ranks[1].namer is None
    ranks[0].namer.hook(None, record)
    assert record == {"straggler_score_min": pytest.approx(0.286, abs=1e-3)}
    assert [(b.node, b.cause) for b in NodeLedger("").blames()] == [(named.node, "straggler")]


def test_a_checkpoint_functions_slow_rank_is_named_on_the_local_profile(local_profile: Path) -> None:
    """Two ranks of a function with a slurmkit.Checkpoint over slurmkit.distributed: rank 1's steps
    take 4x rank 0's (rank 0 waits for it in the stop vote, which is not its own work)."""
    import slurmkit

    ex = slurmkit.Executor(profile=str(local_profile), tasks_per_node=2, name="paced",
                           env={"SLURMKIT_STRAGGLER_PERIOD_S": "0.3"})
    job = ex.submit(helpers_fns.paced_steps, 150, 0.01)
    assert job.result(timeout=300) == 0
    (named,) = Stragglers.read(RunPaths(Path(job.run_dir)))
    assert named.rank == 1 and named.score < 0.7
