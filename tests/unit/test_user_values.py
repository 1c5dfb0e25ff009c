"""Values as users write them in YAML and --set: Slurm times and memory, numbers in kwargs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from slurmkit.config.fields import time_to_minutes
from slurmkit.errors import ConfigError, RunNotFoundError
from slurmkit.load.loader import resolve
from slurmkit.runs.jobs import dry_run
from tests.conftest import write_spec


def resolved_resources(tmp_path: Path, profile: Path, text: str, sets: list[str] | None = None) -> Any:
    path = tmp_path / "spec.yaml"
    path.write_text(f"name: v\ncommand: 'true'\nresources:\n  {text}\n")
    return resolve(path, str(profile), sets)


@pytest.mark.parametrize(("written", "kept"), [
    ("time: 1:30:00", "1:30:00"),  # YAML 1.1 reads this as the base-60 integer 5400, i.e. 5400 minutes
    ("time: 90", "90"),  # a number: minutes, as Slurm reads --time=90
    ("time: 2-00:00:00", "2-00:00:00"),
    ("time: '45:00'", "45:00"),
    ("time: UNLIMITED", "UNLIMITED"),  # sbatch's words for no limit, all read as UNLIMITED
    ("time: infinite", "UNLIMITED"),
    ("mem: 8GB", "8G"),  # as people write it; Slurm's form is kept
    ("mem: 8G", "8G"),
    ("mem: 8000", "8000"),
])
def test_slurm_times_and_memory_as_written(tmp_path: Path, local_profile: Path, written: str, kept: str) -> None:
    res = resolved_resources(tmp_path, local_profile, written).resources
    assert getattr(res, written.split(":")[0]) == kept


def test_no_limit_renders_as_sbatch_takes_it_and_counts_as_no_minutes(tmp_path: Path, local_profile: Path) -> None:
    resolved = resolved_resources(tmp_path, local_profile, "time: INFINITE")
    assert "#SBATCH --time=UNLIMITED" in dry_run(resolved).script
    assert time_to_minutes("UNLIMITED") == 0 == time_to_minutes("0")


def test_set_gives_the_same_time_as_the_file(tmp_path: Path, local_profile: Path) -> None:
    via_set = resolved_resources(tmp_path, local_profile, "nodes: 1", ["resources.time=1:30:00"]).resources
    assert via_set.time == "1:30:00"
    script = dry_run(resolved_resources(tmp_path, local_profile, "time: 1:30:00")).script
    assert "1:30:00" in script and "5400" not in script


@pytest.mark.parametrize(("written", "field"), [
    ("time: -1", "time"),  # sbatch's own parser reads it as no limit; written here, it is a typo
    ("time: '-5'", "time"),
    ("nodes: 99999999999999999999999999999", "nodes"),  # rendered as it was, past any int sbatch parses
    ("tasks_per_node: 70000", "tasks_per_node"),  # a 16-bit field in Slurm's job record
    ("cpus_per_task: 65535", "cpus_per_task"),  # Slurm's "unset" value
])
def test_values_slurm_would_not_take_are_refused_naming_the_field(tmp_path: Path, local_profile: Path, written: str,
                                                                  field: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolved_resources(tmp_path, local_profile, written)
    assert str(err.value.where).endswith(f"spec.yaml:resources.{field}")


def test_bad_memory_is_one_line_naming_the_field(tmp_path: Path, local_profile: Path) -> None:
    with pytest.raises(ConfigError, match="invalid memory '8 gigs'") as err:
        resolved_resources(tmp_path, local_profile, "mem: 8 gigs")
    assert str(err.value.where).endswith("spec.yaml:resources.mem")


def test_kwargs_from_a_file_and_from_set_have_the_same_types(tmp_path: Path, local_profile: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("name: v\ncallable: 'm:f'\nkwargs:\n  lr: 1e-3\n  steps: 1_000\n  tag: '1e-3'\n")
    from_file = resolve(path, str(local_profile)).spec.kwargs
    plain = write_spec(tmp_path, filename="plain.yaml", name="v", callable="m:f")
    from_set = resolve(plain, str(local_profile), ["kwargs.lr=1e-3", "kwargs.steps=1_000"]).spec.kwargs
    assert from_file["lr"] == from_set["lr"] == 0.001 and isinstance(from_file["lr"], float)
    assert from_file["steps"] == from_set["steps"] == 1000
    assert from_file["tag"] == "1e-3"  # quoted: text


@pytest.mark.parametrize("text", ["0E0", "1e-3", "1_000", "0x1F", ".5", "1:30:00", "true", "~", "a b"])
def test_what_slurmkit_writes_as_yaml_reads_back_unchanged(text: str) -> None:
    """`profiles show` and the tests write with yamlio.dump: PyYAML's own dumper leaves 0E0 bare,
    which the YAML 1.2 numbers of the loader read as a float."""
    from slurmkit.load import yamlio

    data = {"text": text, "number": 1e-3, "count": 1000}
    assert yamlio.load_text(yamlio.dump(data), "test") == data


def test_an_unset_variable_in_run_root_is_an_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmkit.common.layout import expand_checkpoint_root, expand_root

    monkeypatch.delenv("SLURMKIT_NO_SUCH_VAR", raising=False)
    monkeypatch.setenv("SLURMKIT_SCRATCH", str(tmp_path))
    assert expand_root("$SLURMKIT_SCRATCH/runs") == tmp_path / "runs"
    with pytest.raises(ConfigError, match=r"\$SLURMKIT_NO_SUCH_VAR is not set") as err:
        expand_root("/scratch/$SLURMKIT_NO_SUCH_VAR/runs")
    assert err.value.where == "profile:run_root='/scratch/$SLURMKIT_NO_SUCH_VAR/runs'"
    with pytest.raises(ConfigError, match=r"\$\{SLURMKIT_NO_SUCH_VAR\} is not set"):
        expand_checkpoint_root("s3://bucket/${SLURMKIT_NO_SUCH_VAR}/")
    assert expand_checkpoint_root("s3://bucket/$SLURMKIT_SCRATCH/") == f"s3://bucket/{tmp_path}"
    with pytest.raises(ConfigError, match="run_root is a relative path"):
        expand_root("runs")


def test_submit_with_an_unset_variable_creates_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from slurmkit.cli.app import app

    monkeypatch.delenv("SLURMKIT_NO_SUCH_VAR", raising=False)
    profile = tmp_path / "p.yaml"
    profile.write_text(f"extends: local\nrun_root: {tmp_path}/$SLURMKIT_NO_SUCH_VAR/runs\n")
    spec = write_spec(tmp_path, name="x", command="true")
    result = CliRunner().invoke(app, ["submit", str(spec), "-p", str(profile)])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "$SLURMKIT_NO_SUCH_VAR is not set in this environment" in result.output
    assert not (tmp_path / "$SLURMKIT_NO_SUCH_VAR").exists()  # the literal folder of before


def test_a_raw_job_id_names_a_run_or_a_sweep_task(tmp_path: Path) -> None:
    from slurmkit.common.layout import RunPaths
    from slurmkit.common.record import RunFile, RunRecord
    from slurmkit.common.sweep_layout import ArrayEntry, ArrayList, ArrayLog, SweepPaths
    from slurmkit.runs.lookup import find

    root = tmp_path / "runs"
    run = RunPaths(root / "plain-20261201-120000-abcd")
    RunFile(run).create(RunRecord(run_id=run.run_id, executor="slurm", job_ids=["700", "777"]))
    assert find(str(root), "777") == run and find(str(root), "700") == run  # a resubmission's first job too
    sweep = SweepPaths(root / "sw-sweep-20261201-120000-beef")
    (sweep.sweep_dir / "sweep.json").parent.mkdir(parents=True)
    (sweep.sweep_dir / "sweep.json").write_text('{"sweep_id": "sw", "tasks": []}')
    ArrayLog(sweep).create(ArrayList(arrays=[ArrayEntry(indices=[4, 5, 6], base=4, job_id="900", kind="initial")]))
    RunFile(sweep.task(5)).create(RunRecord(run_id="sw/5", executor="slurm", job_ids=["900_1"]))
    assert find(str(root), "900_1") == sweep.task(5)  # array task 1 of an array based at task 4
    # A step or component id, as sacct and squeue print them, names its job's run.
    assert find(str(root), "777.0") == find(str(root), "777.batch") == find(str(root), "777+0") == run
    assert find(str(root), "900_1.extern") == sweep.task(5)
    with pytest.raises(RunNotFoundError, match="task 6 of sweep .* which has not started yet"):
        find(str(root), "900_2")
    with pytest.raises(RunNotFoundError, match="no run '901'"):
        find(str(root), "901")


def test_after_kinds_and_a_job_slurmkit_did_not_submit(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from slurmkit.cli.app import app
    from slurmkit.runs.dependency import after_dependency

    root = str(tmp_path / "runs")
    assert after_dependency(root, "4242") == "afterok:4242"  # Slurm itself checks a job it knows
    assert after_dependency(root, "4242_3", "afternotok") == "afternotok:4242_3"
    spec = write_spec(tmp_path, name="x", command="true")
    result = CliRunner().invoke(app, ["submit", str(spec), "--after", "1", "--after-any", "2"])
    assert result.exit_code == 2 and "more than one of --after, --after-any, --after-notok" in result.output


@pytest.mark.parametrize(("item", "value"), [
    ("env.X=a #1", "a #1"),  # YAML would read ' #1' as a comment
    ("env.N=4", "4"),
    ("profile.setup.env.A=x: y", "x: y"),  # YAML would read a mapping
    ("name=123", "123"),
    ("resources.time=1:30:00", "1:30:00"),
    ("resources.nodes=2", 2),
    ("config.lr=1e-3", 0.001),
    ("kwargs.flag=true", True),  # kwargs are free-form: typed by YAML
    ("profile.requeue.crash=0", 0),
    ("profile.checkpoint_root=null", None),  # a text field that may be unset: YAML's null unsets it
    ("profile.checkpoint_root=s3://b/x #1", "s3://b/x #1"),
])
def test_a_set_value_is_typed_by_the_field_it_targets(item: str, value: Any) -> None:
    from slurmkit.load.overrides import parse_set

    assert parse_set(item)[1] == value and type(parse_set(item)[1]) is type(value)


def test_a_text_set_value_reaches_the_script_whole(tmp_path: Path, local_profile: Path) -> None:
    spec = write_spec(tmp_path, name="x", command="true")
    script = dry_run(resolve(spec, str(local_profile), ["env.X=a #1"])).script
    assert "export X='a #1'" in script
