"""The requeue policy's decisions that need no Slurm call (the rest runs in test_cluster_faults)."""

from __future__ import annotations

import json
from pathlib import Path

from slurmkit.common import outcomes
from slurmkit.runs import RunPaths, RunRecord
from slurmkit.worker import requeue


def _run(tmp_path: Path, **record: object) -> RunPaths:
    paths = RunPaths(tmp_path / "run")
    paths.job_folder.mkdir(parents=True)
    RunRecord(paths).create({"run_id": "run", "num_tasks": 2, "job_ids": ["7"],
                            "profile": {"requeue": {"preemption": 2, "crash": 1, "hang": 1}}, **record})
    return paths


def _results(paths: RunPaths, *found: tuple[str, object]) -> None:
    for rank, (state, value) in enumerate(found):
        if state == outcomes.SUCCESS:
            outcomes.record(paths.outcome_file("7", rank), state, value=value)
        else:
            outcomes.record(paths.outcome_file("7", rank), state, error=str(value))


def test_every_rank_succeeded_means_completed(tmp_path: Path) -> None:
    paths = _run(tmp_path)
    _results(paths, ("success", 1), ("success", 2))
    assert requeue.after_failure(paths, "7", 134) == requeue.COMPLETED
    assert requeue.main(["--run-dir", str(paths.run_dir), "--exit-code", "134"]) == 2  # not inside a job


def test_same_error_at_the_same_step_twice_is_final(tmp_path: Path) -> None:
    trace = "Traceback (most recent call last):\nValueError: bad batch"
    paths = _run(tmp_path, failures=[{"error": "ValueError: bad batch", "step": 30}])
    paths.metrics.write_text(json.dumps({"step": 30}) + "\n")
    _results(paths, ("error", trace), ("error", trace))
    decision = requeue.after_failure(paths, "7", 1)
    assert decision.startswith("not requeued: the same error at step 30 twice")
    assert "deterministic error at step 30" in RunRecord(paths).read()["final"]


def test_budgets_are_per_cause(tmp_path: Path) -> None:
    record = {"profile": {"requeue": {"preemption": 2, "crash": 1}},
              "restarts": [{"cause": "preemption"}, {"cause": "crash"}]}
    assert requeue.allowed(record, "preemption")
    assert not requeue.allowed(record, "crash")
    assert requeue.allowed(record, "requeue")  # an external requeue spends the preemption budget
    assert requeue.budget(record, "unknown") == 2
    assert not requeue.allowed({**record, "final": "done"}, "preemption")
