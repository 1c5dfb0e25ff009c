"""A run's own metrics reach slurmkit wherever it shows metrics, whatever runs them: values a
command logs with slurmkit.tracking.log land in its logged.jsonl, `sweep results` shows them for a
command sweep (not only `returncode`), the report draws them, and the run's MLflow run ends
FINISHED; a local run's goodput counts its start-up, and a failed one is drawn FAILED (issue 51,
item 4)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

import slurmkit
from slurmkit.cli.app import app
from slurmkit.common import sweep_layout
from slurmkit.common.layout import RunPaths
from slurmkit.common.metrics import last_values, read_records
from slurmkit.insight import report
from tests.unit.test_sweeps import wait_local, write_sweep

runner = CliRunner()

# A user's script: its own loop, its own numbers, slurmkit's log (rank 0 writes; a no-op elsewhere).
SCRIPT = """\
import os, slurmkit
lr = float(os.environ["LR"])
for step in range(1, 6):
    slurmkit.tracking.log({"loss": 1.0 / (step * lr)}, step)
slurmkit.tracking.log({"val_loss": 0.5 / lr}, 5)
"""


def test_a_command_sweeps_logged_values_reach_its_results_and_its_mlflow_runs_end_finished(
        tmp_path: Path, local_profile: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    client.search_experiments()  # the schema made once here: two tasks' first opens would race to make it
    path = write_sweep(tmp_path, {"grid": {"env.LR": ["1", "4"]}}, command=f"{sys.executable} {script}",
                       tracking={"mlflow": uri})
    result = runner.invoke(app, ["sweep", str(path), "-p", str(local_profile), "--json"])
    assert result.exit_code == 0, result.output
    paths = sweep_layout.SweepPaths(Path(json.loads(result.stdout)["sweep_dir"]))
    assert [s.state for s in wait_local(paths)] == ["COMPLETED", "COMPLETED"]
    logged = read_records(paths.task(1).logged)
    assert [(r["step"], r.get("loss"), r.get("val_loss")) for r in logged] == [
        (1, 0.25, None), (2, 0.125, None), (3, 1 / 12, None), (4, 0.0625, None), (5, 0.05, None), (5, None, 0.125)]
    assert last_values(paths.task(1).logged) == {"step": 5, "val_loss": 0.125, "loss": 0.05}

    result = runner.invoke(app, ["sweep", "results", paths.sweep_id, "-p", str(local_profile), "--json",
                                 "--sort", "val_loss"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["env.LR"], r["val_loss"], r["loss"], r["returncode"]) for r in rows] == [
        ("4", 0.125, 0.05, 0), ("1", 0.5, 0.2, 0)]  # sorted by the logged metric, best first

    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    tasks = [r for r in runs if r.data.tags.get("slurmkit/run_id", "").startswith(paths.sweep_id)]
    assert len(tasks) == 2 and {r.info.status for r in tasks} == {"FINISHED"}
    assert sorted(m.value for r in tasks for m in client.get_metric_history(r.info.run_id, "val_loss")) == [0.125, 0.5]


def test_a_command_runs_report_draws_what_it_logged_and_says_why_it_has_no_goodput(
        tmp_path: Path, local_profile: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    job = slurmkit.Executor(profile=str(local_profile), name="cmd", env={"LR": "2"}).submit_command(
        [sys.executable, str(script)])
    job.wait(timeout=120)
    data = report.collect(RunPaths(Path(job.run_dir)))
    assert data.logged["loss"] == [(s, 1.0 / (s * 2)) for s in range(1, 6)] and data.logged["val_loss"] == [(5, 0.25)]
    assert data.steps == [] and data.accounting.steps == 0  # no step timed: the headline says so, not 0.0 %
    assert [s.state for s in data.segments] == ["COMPLETED"]
    assert report.write(RunPaths(Path(job.run_dir)), tmp_path / "r.png").logged  # drawn, not empty axes


def test_a_local_runs_report_counts_its_start_up_and_shows_a_failure_as_failed(
        tmp_path: Path, local_profile: Path) -> None:
    """The wall a local run's goodput divides by runs from its controller's start to its end, so the
    start-up (before the first step) is the job's time too; a failed run is FAILED on the timeline."""
    spec = tmp_path / "digits.yaml"
    spec.write_text(yaml.safe_dump({"name": "digits", "task": "train",
                                    "config": {"model": "digits", "steps": 20, "batch_size": 32, "log_every": 5}}))
    result = runner.invoke(app, ["submit", str(spec), "-p", str(local_profile), "--wait", "--json"])
    assert result.exit_code == 0, result.output
    paths = RunPaths(Path(json.loads(result.stdout)["run_dir"]))
    records = read_records(paths.metrics)
    first_step_began = records[0]["time"] - records[0]["step_s_sum"]
    data = report.collect(paths)
    (seg,) = data.segments
    assert seg.state == "COMPLETED" and seg.start is not None and seg.end is not None
    assert seg.start < records[0]["startup"]["process_start"] < first_step_began  # the controller came first
    assert data.accounting.wall_s >= records[-1]["time"] - seg.start > records[-1]["time"] - first_step_began
    assert data.accounting.steps == 20 and 0 < data.accounting.goodput < 1

    failing = slurmkit.Executor(profile=str(local_profile), name="bad").submit_command(["bash", "-c", "exit 3"])
    failing.wait(timeout=120)
    assert [s.state for s in report.collect(RunPaths(Path(failing.run_dir))).segments] == ["FAILED"]
