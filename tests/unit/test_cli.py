"""The CLI through typer's CliRunner: thin commands, one-line errors, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from slurmkit import __version__
from slurmkit.cli.app import app
from tests.conftest import ROOT, steady, write_spec

runner = CliRunner()


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"slurmkit {__version__}"


def test_no_args_shows_help() -> None:
    result = runner.invoke(app, [])
    assert "submit" in result.output and "render" in result.output


def test_render_prints_the_script_with_set_overrides(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, name="cli", command="true")
    result = runner.invoke(app, ["render", str(spec), "-p", "devcluster", "--set", "resources.nodes=2",
                                 "--set", "name=renamed"])
    assert result.exit_code == 0, result.output
    assert "#SBATCH --nodes=2" in result.output
    assert "#SBATCH --job-name=renamed" in result.output
    assert result.output.startswith("#!/bin/bash")


def test_user_error_is_one_line_exit_2_no_traceback(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, name="cli", command="true", resources={"nodse": 2})
    result = runner.invoke(app, ["render", str(spec), "-p", "devcluster"])
    assert result.exit_code == 2
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1
    assert lines[0].startswith(f"error: {spec}:resources.nodse: unknown field 'nodse' (did you mean 'nodes'?)")
    assert "Traceback" not in result.output


def test_real_process_error_has_no_traceback(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, name="cli", command="true")
    proc = subprocess.run([sys.executable, "-m", "slurmkit", "render", str(spec), "-p", "nosuchprofile"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "unknown profile 'nosuchprofile'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_profiles_list_show_validate_schema(tmp_path: Path) -> None:
    listed = json.loads(runner.invoke(app, ["profiles", "list", "--json"]).output)
    assert {"local", "devcluster", "gpu-pyxis"} <= {p["name"] for p in listed}
    shown = yaml.safe_load(runner.invoke(app, ["profiles", "show", "cpu-partition"]).output)
    assert shown["partition"] == "cpu" and shown["signal"] == "USR2"
    good = tmp_path / "good.yaml"
    good.write_text("extends: devcluster\nqos: high\n")
    assert runner.invoke(app, ["profiles", "validate", str(good)]).exit_code == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("signal: USR3\n")
    result = runner.invoke(app, ["profiles", "validate", str(bad)])
    assert result.exit_code == 2 and "bad.yaml:signal" in result.output
    schema = json.loads(runner.invoke(app, ["profiles", "schema"]).output)
    assert schema["additionalProperties"] is False
    assert "partition" in schema["properties"]
    assert schema["properties"]["partition"]["description"]


def test_submit_dry_run_prints_script_and_creates_nothing(tmp_path: Path, dev_profile: Path,
                                                          run_root: Path) -> None:
    spec = write_spec(tmp_path, name="dry", command="true")
    result = runner.invoke(app, ["submit", str(spec), "-p", str(dev_profile), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "#SBATCH --job-name=dry" in result.output
    assert list(run_root.iterdir()) == []


def test_module_entry_point_exists() -> None:
    assert (ROOT / "slurmkit" / "__main__.py").exists()


def test_local_profile_runs_the_same_spec_without_slurm(tmp_path: Path, local_profile: Path) -> None:
    """Needs no cluster (moved out of test_cluster_jobs.py, where every test is marked cluster)."""
    from slurmkit.common.layout import RunPaths
    from slurmkit.runs import jobs

    spec = write_spec(tmp_path, name="loc", callable="tests.helpers_fns:add", kwargs={"a": 20, "b": 22})
    result = CliRunner().invoke(app, ["submit", str(spec), "-p", str(local_profile), "--json"])
    assert result.exit_code == 0, result.output
    paths = RunPaths(Path(json.loads(result.stdout)["run_dir"]))
    assert jobs.wait(paths, poller=steady(0.5)).state == "COMPLETED"
    assert [jobs.result(paths, rank=r)["sum"] for r in (0, 1)] == [42, 42]


def test_every_flag_reads_as_a_flag_in_help() -> None:
    """No `--wait <bool>`: a flag takes no value, and its help must not suggest one."""
    import typer.main

    def commands(group: Any, path: list[str]) -> list[list[str]]:
        found = [path]
        for name, sub in getattr(group, "commands", {}).items():
            found += commands(sub, [*path, name])
        return found

    shown = 0
    for path in commands(typer.main.get_command(app), []):
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, (path, result.output)
        assert "<bool>" not in result.output, path
        shown += "--help" in result.output
    assert shown >= 20  # every command and subcommand was asked


def test_a_finished_runs_numbers_read_as_a_person_reads_them() -> None:
    from slurmkit.cli.jobs_cmd import human_lines

    value = {"accuracy": 0.9665738344192505, "samples_per_s": 24006.3, "mfu": 0.029095481175676816,
             "median_step_s": 0.002665980999992712, "wall_s": 2.448, "loss": 0.03935757279396057, "steps": 1200,
             "returncode": 0}
    assert human_lines(value) == ["accuracy: 96.7 %", "samples_per_s: 24,006/s", "mfu: 2.9 %",
                                  "median_step_s: 2.67 ms", "wall_s: 2.45 s", "loss: 0.03936", "steps: 1,200",
                                  "returncode: 0"]


def test_status_never_cuts_the_run_id_and_list_has_a_header(tmp_path: Path) -> None:
    profile = tmp_path / "p.yaml"
    profile.write_text(yaml.safe_dump({"extends": "local", "run_root": str(tmp_path / "runs")}))
    spec = write_spec(tmp_path, name="a-rather-long-experiment-name", command="true")
    done = json.loads(runner.invoke(app, ["submit", str(spec), "-p", str(profile), "--wait", "--json"]).stdout)
    status = runner.invoke(app, ["status", "-p", str(profile)], env={"COLUMNS": "80"})
    assert done["run_id"] in status.stdout
    listed = runner.invoke(app, ["list", "-p", str(profile)]).stdout.splitlines()
    assert listed[0].split("\t") == ["run_id", "state", "job_id", "run_dir"] and listed[1].startswith(done["run_id"])


def test_a_train_spec_that_leaves_its_profiles_gpus_idle_is_warned_at_render(monkeypatch: Any) -> None:
    monkeypatch.setenv("USER", "alice")
    gpt = str(ROOT / "examples" / "train_gpt.yaml")
    warned = runner.invoke(app, ["render", gpt, "-p", "gpu-pyxis"])
    assert warned.exit_code == 0, warned.output
    (line,) = [ln for ln in warned.stderr.splitlines() if ln.startswith("warning:")]
    assert line.startswith(f"warning: {gpt}:resources.tasks_per_node=2 ")  # where, then why
    quiet = runner.invoke(app, ["render", gpt, "-p", "gpu-pyxis", "--set", "resources.tasks_per_node=8"])
    assert quiet.exit_code == 0 and "warning:" not in quiet.stderr
