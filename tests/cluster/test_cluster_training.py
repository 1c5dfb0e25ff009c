"""Training and the all-reduce benchmark across the dev cluster's two nodes (gloo)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from slurmkit.cli.app import app
from slurmkit.common.layout import RunPaths
from slurmkit.load.loader import resolve
from slurmkit.runs import jobs
from slurmkit.runs import logs as run_logs
from tests.conftest import EXAMPLES, executed_steps, steady

pytestmark = pytest.mark.cluster


def test_digits_on_two_nodes_reaches_95_percent_with_equal_digests(cluster: None, dev_profile: Path) -> None:
    res = resolve(EXAMPLES / "train_digits.yaml", str(dev_profile),
                  ["resources.nodes=2", "resources.tasks_per_node=1"])
    sub = jobs.submit(res)
    paths = RunPaths(Path(sub.run_dir))
    assert jobs.wait(paths, poller=steady(0.5), timeout_s=300).state == "COMPLETED"
    ranks = [jobs.result(paths, rank=r) for r in (0, 1)]
    assert ranks[0]["accuracy"] >= 0.95
    assert ranks[0]["backend"] == "gloo" and ranks[0]["world_size"] == 2
    assert ranks[0]["params_sha256"] == ranks[1]["params_sha256"]
    # Rank 0 alone writes; its records cover every step once.
    assert executed_steps(paths.metrics) == list(range(1, ranks[0]["steps"] + 1)) and ranks[0]["steps"] == 300
    logs = "\n".join(run_logs.logs(paths, rank=0))
    assert "step 300/300" in logs


def test_bench_allreduce_on_two_nodes(cluster: None, dev_profile: Path) -> None:
    started = time.monotonic()
    result = CliRunner().invoke(app, ["bench", "allreduce", "-p", str(dev_profile), "--nodes", "2",
                                      "--max-bytes", str(1 << 20), "--json"])
    wall_s = time.monotonic() - started
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["world_size"] == 2 and data["backend"] == "gloo"
    rows = data["rows"]
    assert [r["bytes"] for r in rows] == [8 << i for i in range(18)]
    for r in rows:
        # Independent of the code's formula: bytes over the measured time, and nccl-tests' factor
        # 2(n-1)/n for an all-reduce over n = 2 ranks.
        algbw = r["bytes"] / (r["time_us"] / 1e6) / 1e9
        assert r["algbw_GBps"] == pytest.approx(algbw) and r["memcpy_GBps"] > 0
        assert r["busbw_GBps"] == pytest.approx(algbw * 2 * (2 - 1) / 2)
    # The times it reports were measured inside this run: together they fit in its wall time.
    assert sum(r["iters"] * r["time_us"] for r in rows) / 1e6 < wall_s
