"""The local profile never runs a Slurm binary, whatever is on PATH, and its runs are told apart from a
cluster's sharing the same run root: here PATH starts with stand-ins for every Slurm command (fakes,
named so) that only record that they were called."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from slurmkit.cli.app import app
from slurmkit.common.record import RunFile, RunRecord
from slurmkit.runs import registry
from tests.conftest import write_spec

SLURM_BINARIES = ("sbatch", "srun", "squeue", "sacct", "scancel", "scontrol", "sinfo", "salloc", "sacctmgr")
runner = CliRunner()


@pytest.fixture
def slurm_standins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder of stand-in Slurm commands first on PATH; each call appends its name to the log it returns."""
    folder, log = tmp_path / "standin-slurm", tmp_path / "slurm-calls.log"
    folder.mkdir()
    for name in SLURM_BINARIES:
        stub = folder / name
        stub.write_text(f"#!/bin/sh\n# stand-in {name}: records the call, answers nothing\necho {name} >> {log}\n")
        stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    return log


def cluster_run(run_root: Path) -> str:
    """A run a Slurm profile submitted into the same run root (as ~/slurmkit-runs is both profiles')."""
    paths = registry.create(str(run_root), "ondev")
    RunFile(paths).create(RunRecord(run_id=paths.run_id, name="ondev", run_dir=str(paths.run_dir), executor="slurm",
                                    profile_name="devcluster", job_ids=["4242"], num_tasks=1))
    return paths.run_id


def test_the_local_profile_runs_no_slurm_binary_and_sees_only_its_own_runs(
        tmp_path: Path, local_profile: Path, run_root: Path, slurm_standins: Path) -> None:
    on_cluster = cluster_run(run_root)
    spec = write_spec(tmp_path, name="here", command="echo hi", resources={"tasks_per_node": 1})
    done = runner.invoke(app, ["submit", str(spec), "-p", str(local_profile), "--wait", "--json"])
    assert done.exit_code == 0, done.output
    local_id = json.loads(done.stdout)["run_id"]
    listed = runner.invoke(app, ["list", "-p", str(local_profile), "--json"])
    assert listed.exit_code == 0, listed.output
    assert [(r["run_id"], r["executor"]) for r in json.loads(listed.stdout)] == [(local_id, "local")]
    status = runner.invoke(app, ["status", "-p", str(local_profile)])
    assert status.exit_code == 0 and "pid " in status.stdout  # a local run's job id says it is a pid
    for argv in (["status", on_cluster], ["cancel", on_cluster], ["logs", on_cluster], ["wait", on_cluster]):
        refused = runner.invoke(app, [*argv, "-p", str(local_profile)])
        assert refused.exit_code == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.output
    assert not slurm_standins.exists()  # no Slurm command ran


def test_a_slurm_profile_still_sees_both(tmp_path: Path, run_root: Path, slurm_standins: Path) -> None:
    """The same run root under a Slurm profile: both runs listed, squeue asked for the Slurm one only."""
    from slurmkit.runs import jobs
    from slurmkit.runs.lookup import Scope

    on_cluster = cluster_run(run_root)
    rows = jobs.status(Scope(str(run_root), "slurm"))
    assert [r.run_id for r in rows] == [on_cluster]
    assert "squeue" in slurm_standins.read_text().split()  # asked, as a Slurm profile must


def test_tables_into_a_pipe_keep_whole_cells(tmp_path: Path, run_root: Path, local_profile: Path) -> None:
    """rich takes a pipe for an 80-column terminal: a long run id was cut to its first letter and '…'."""
    name = "a-long-experiment-name-" + "x" * 40
    paths = registry.create(str(run_root), name)
    RunFile(paths).create(RunRecord(run_id=paths.run_id, name=name, run_dir=str(paths.run_dir), executor="local"))
    shown = runner.invoke(app, ["status", "-p", str(local_profile)])  # CliRunner's stdout is no terminal
    assert shown.exit_code == 0, shown.output
    assert paths.run_id in shown.stdout and "…" not in shown.stdout


def test_a_summary_prints_only_the_fields_that_apply() -> None:
    from slurmkit.cli.jobs_cmd import human_lines

    summary = {"accuracy": 0.967, "samples_per_s": 24006.2, "tokens_per_s": 0.0, "resumed_from_step": None,
               "steps": 300}
    assert human_lines(summary) == ["accuracy: 96.7 %", "samples_per_s: 24,006/s", "steps: 300"]


def test_a_hint_is_its_own_clause_in_the_one_line() -> None:
    from slurmkit.errors import SlurmkitError

    hint = SlurmkitError("only a Slurm run can be resubmitted", where="r1", valid="submit a local run again")
    listed = SlurmkitError("bad value", where="f.yaml:x", valid="valid: a, b")
    assert hint.one_line() == "r1: only a Slurm run can be resubmitted; submit a local run again"
    assert listed.one_line() == "f.yaml:x: bad value valid: a, b"
