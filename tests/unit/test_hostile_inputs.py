"""Inputs that once got past the checks or ended in a traceback: abbreviated Slurm options,
records with numbers no pid can be, snapshot records without a field, output files that cannot be
files, integers past Python's 4,300 digits, a NUL in a command, credentials in a tracking URI,
a grid that lists a value twice, a sweep named after a file full of shell characters."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from slurmkit.cli.app import app
from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RunFile
from slurmkit.config.runspec import RunSpec
from slurmkit.config.slurm_args import SLURMKIT_OWNS, SRUN_OWNS, owner_of
from slurmkit.config.tracking import Tracking, redact
from slurmkit.errors import ConfigError
from slurmkit.runs import folders, procs
from slurmkit.sweeps import spec as sweep_spec
from tests.conftest import write_spec
from tests.unit.test_bad_input import refused

runner = CliRunner()


@pytest.mark.parametrize("where, value", [
    ("sbatch_args", {"ou": "/tmp/x"}), ("sbatch_args", {"sig": "USR1@60"}), ("sbatch_args", {"dep": "afterok:1"}),
    ("sbatch_args", {"parti": "other"}), ("sbatch_args", {"--tim": "1:00"}), ("sbatch_args", {"no-req": True}),
    ("srun_args", ["--kill-on=0"]), ("srun_args", ["--outp=x"]), ("srun_args", ["--expo=NONE"]),
    ("srun_args", ["--overl"]),
])
def test_an_abbreviation_of_an_option_slurmkit_owns_is_refused(tmp_path: Path, where: str, value: Any) -> None:
    spec = write_spec(tmp_path, name="x", command="true", **{where: value})
    refused(["render", str(spec)])


@pytest.mark.parametrize("option", ["--ou=/tmp/x", "--output=/tmp/x", "--sig=USR1@60", "--array=0-3"])
def test_sbatch_extra_holds_to_the_owned_options_too(tmp_path: Path, option: str) -> None:
    spec = write_spec(tmp_path, name="x", command="true")
    refused(["render", str(spec), "--set", f"profile.sbatch_extra=[{option}]"])


@pytest.mark.parametrize("name", ["gpus", "container", "comment", "mail-type", "exclusive", "gres-flags"])
def test_an_option_of_its_own_name_is_not_taken_for_an_abbreviation(name: str) -> None:
    assert owner_of(name, SLURMKIT_OWNS) is None


def test_every_prefix_that_reaches_an_owned_option_alone_is_refused() -> None:
    """getopt_long's rule over the owned names alone: a prefix one owned option starts with is that
    option (tests/cluster/test_cluster_sbatch_parser.py holds it against the real sbatch and srun)."""
    for owns in (SLURMKIT_OWNS, SRUN_OWNS):
        for owned in owns:
            for n in range(2, len(owned)):
                prefix = owned[:n]
                if prefix not in ("gpus", "container"):
                    assert owner_of(prefix, owns) is not None, prefix


def test_a_record_with_a_job_id_no_pid_can_be_breaks_no_status(run_root: Path, local_profile: Path) -> None:
    folder = run_root / "huge-20260101-000000-0000abcd"
    folder.mkdir(mode=0o700)
    (folder / "run.json").write_text(json.dumps({
        "run_id": folder.name, "name": "huge", "executor": "local", "num_tasks": 1, "run_dir": str(folder),
        "job_ids": ["12345678901234567890"], "pid_starts": {"12345678901234567890": 5}}))
    os.chmod(folder / "run.json", 0o600)
    assert not procs.pid_alive(12345678901234567890) and not procs.pid_alive(-4)
    for argv in (["status"], ["status", folder.name], ["list", "--json"], ["cancel", folder.name]):
        result = runner.invoke(app, [*argv, "-p", str(local_profile)])
        assert result.exception is None or isinstance(result.exception, SystemExit), (argv, result.output)
        assert "Traceback" not in result.output


def test_a_snapshot_record_without_its_fields_breaks_no_report(tmp_path: Path, local_profile: Path,
                                                             run_root: Path) -> None:
    spec = write_spec(tmp_path, name="snap", command="true")
    done = runner.invoke(app, ["submit", str(spec), "-p", str(local_profile), "--wait", "--json"])
    assert done.exit_code == 0, done.output
    (folder,) = folders.owned_folders(str(run_root), "run.json", "run")
    RunFile(RunPaths(folder)).update(snapshot={"source": "/somewhere"})
    result = runner.invoke(app, ["report", folder.name, "-p", str(local_profile)])
    assert result.exit_code == 0, result.output
    html = str(tmp_path / "r.html")
    out = runner.invoke(app, ["report", folder.name, "-p", str(local_profile), "-o", html, "--json"])
    assert out.exit_code == 0 and json.loads(out.stdout)["snapshot"] == {"source": "/somewhere"}


@pytest.mark.parametrize("target", ["", " ", "DIR", "/proc/self/status", "FIFO", "FILE/r.csv"])
def test_an_output_file_that_cannot_be_one_is_one_line(tmp_path: Path, local_profile: Path, run_root: Path,
                                                        target: str) -> None:
    sweep = tmp_path / "g.yaml"
    sweep.write_text(yaml.safe_dump({"name": "g", "callable": "os:getcwd", "sweep": {"grid": {"env.A": ["1"]}}}))
    assert runner.invoke(app, ["sweep", str(sweep), "-p", str(local_profile), "--wait"]).exit_code == 0
    (paths,) = folders.list_sweeps(str(run_root))
    # A FIFO stands for /dev/null and its kind: a write beside and a rename over would replace it
    # (a regression here must not replace the machine's own /dev/null).
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    path = {"DIR": str(tmp_path), "FIFO": str(fifo), "FILE/r.csv": str(sweep / "r.csv")}.get(target, target)
    refused(["sweep", "results", paths.sweep_id, "-p", str(local_profile), "--csv", path])
    spec = write_spec(tmp_path, name="r", command="true")
    assert runner.invoke(app, ["submit", str(spec), "-p", str(local_profile), "--wait"]).exit_code == 0
    run = next(f for f in folders.owned_folders(str(run_root), "run.json", "run") if f.name.startswith("r-"))
    refused(["report", run.name, "-p", str(local_profile), "-o", path])


@pytest.mark.parametrize("text", ["steps: " + "9" * 5000, "name: x\nwhen: 2024-13-45"])
def test_values_python_cannot_read_are_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(f"name: x\ncommand: 'true'\nconfig:\n  {text.replace(chr(10), chr(10) + '  ')}\n")
    refused(["render", str(path)])
    refused(["render", str(write_spec(tmp_path, name="y", command="true")), "--set", "config.n=" + "7" * 5000])


@pytest.mark.parametrize("field, value", [("command", "echo a\x00b"), ("kwargs", {"a": "b\x00"}),
                                          ("config", {"x": ["\x00"]})])
def test_a_nul_is_refused_even_where_newlines_are_fine(field: str, value: Any) -> None:
    fields = {"command": {"name": "x"}, "kwargs": {"name": "x", "callable": "os:getcwd"},
              "config": {"name": "x", "task": "train"}}[field]
    with pytest.raises(ValidationError):
        RunSpec.model_validate({**fields, field: value})
    RunSpec.model_validate({**fields, field: value.replace("\x00", "\n") if isinstance(value, str) else {}})


def test_a_nul_in_a_command_is_refused_at_submit(tmp_path: Path, run_root: Path) -> None:
    path = tmp_path / "nul.json.yaml"
    path.write_text(json.dumps({"name": "nul", "command": "echo a\u0000b"}))  # JSON is YAML: \u0000 reaches the model
    refused(["submit", str(path), "-p", "local"])


@pytest.mark.parametrize("uri", ["HTTPS://bob:hunter2@host", "https://bob:hun ter2@host/x", "https://tok3n@host",
                                 "http://host:5000/?token=tok3n", "https://host/x#tok3n", "Http://a:tok3n@h"])
def test_credentials_in_a_tracking_uri_are_refused_and_never_echoed(tmp_path: Path, uri: str) -> None:
    with pytest.raises(ValidationError):
        Tracking(mlflow=uri)
    spec = write_spec(tmp_path, name="t", command="true", tracking={"mlflow": uri})
    result = refused(["render", str(spec)])
    for secret in ("hunter2", "hun ter2", "tok3n"):
        assert secret not in result.output
    assert "tok3n" not in redact(f"failed: {uri} did not answer") and "hunter2" not in redact(uri)


def test_a_grid_that_lists_a_value_twice_is_refused() -> None:
    with pytest.raises(ConfigError):
        sweep_spec.load({"name": "g", "command": "true", "sweep": {"grid": {"env.A": ["1", "2", "1"]}}})
    plan = sweep_spec.load({"name": "g", "callable": "os:getcwd", "sweep": {"grid": {"kwargs.x": [1, 1.0, True]}}})
    assert len(plan.overrides) == 3, "1, 1.0 and true are three values, as the spec reads them"


def test_a_sweep_named_after_a_file_of_shell_characters_gets_a_safe_id(tmp_path: Path, local_profile: Path,
                                                                      run_root: Path) -> None:
    path = tmp_path / "$(touch pwned);`x` a&b.yaml"
    path.write_text(yaml.safe_dump({"callable": "os:getcwd", "sweep": {"grid": {"env.A": ["1"]}}}))
    # The run spec's name comes from --set; the sweep's, from the file's name.
    result = runner.invoke(app, ["sweep", str(path), "-p", str(local_profile), "--set", "name=ok", "--wait"])
    assert result.exit_code == 0, result.output
    (paths,) = folders.list_sweeps(str(run_root))
    assert set(paths.sweep_id) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()
