"""A run's secrets reach its ranks and nothing written, and a run started from inside a command run
knows nothing of the outer run (its markers, its run folder, its tracker runs): real local runs."""

from __future__ import annotations

import hashlib
import json
import secrets
from pathlib import Path

import pytest
from typer.testing import CliRunner

from slurmkit.cli.app import app
from slurmkit.common.slurm_env import outer_job_env
from tests.conftest import write_spec

runner = CliRunner()


def submit_and_wait(spec: Path, profile: Path) -> dict[str, object]:
    done = runner.invoke(app, ["submit", str(spec), "-p", str(profile), "--wait", "--json"])
    assert done.exit_code == 0, done.output
    answer: dict[str, object] = json.loads(done.stdout)
    assert answer["state"] == "COMPLETED", answer
    return answer


def test_a_secret_reaches_the_ranks_and_is_written_nowhere(tmp_path: Path, local_profile: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    value = "sk-" + secrets.token_hex(16)
    monkeypatch.setenv("SK_TEST_API_KEY", value)
    spec = write_spec(tmp_path, name="secret", command='printf %s "$SK_TEST_API_KEY" | sha256sum',
                      secret_env=["SK_TEST_API_KEY"], resources={"tasks_per_node": 1})
    done = submit_and_wait(spec, local_profile)
    result = done["result"]
    assert isinstance(result, dict)
    assert str(result["stdout"]).split()[0] == hashlib.sha256(value.encode()).hexdigest()
    run_dir = Path(str(done["run_dir"]))
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.name == "run.json" for p in files) and any(p.suffix == ".pkl" for p in files)
    assert [p for p in files if value.encode() in p.read_bytes()] == []  # run.json, script, pickles, logs
    record = json.loads((run_dir / "run.json").read_text())
    assert record["spec"]["secret_env"] == ["SK_TEST_API_KEY"]


INNER_PROBE = "os:getenv"  # the inner run's rank 0 returns what it sees of the outer run's variables


def test_a_run_started_from_a_command_run_never_sees_the_outer_runs_markers(tmp_path: Path, local_profile: Path,
                                                                           run_root: Path) -> None:
    inner = write_spec(tmp_path, filename="inner.yaml", name="inner", callable=INNER_PROBE,
                       kwargs={"key": "SLURMKIT_COMMAND_STOP", "default": "unset"}, resources={"tasks_per_node": 1})
    outer = write_spec(tmp_path, filename="outer.yaml", name="outer", resources={"tasks_per_node": 1},
                       command=f"python -P -m slurmkit submit {inner} -p {local_profile} --wait --json")
    done = submit_and_wait(outer, local_profile)
    result = done["result"]
    assert isinstance(result, dict)
    inner_done = json.loads(str(result["stdout"]))
    assert inner_done["state"] == "COMPLETED"
    assert Path(inner_done["run_dir"]).parent == run_root and inner_done["run_dir"] != done["run_dir"]
    assert inner_done["result"] == "unset"  # the outer command's stop marker did not reach it


def test_the_outer_runs_variables_are_named_only_inside_a_run() -> None:
    outside = {"SLURMKIT_COMMAND_STOP": "/x", "WANDB_RUN_ID": "mine", "SLURMKIT_PROFILE": "p"}
    assert outer_job_env(outside) == []  # not in a run: the user's own settings, all kept
    inside = {**outside, "SLURMKIT_RUN_DIR": "/runs/a", "MLFLOW_RUN_ID": "r", "SLURM_CONF": "/etc/slurm.conf",
              "HOME": "/root"}
    assert outer_job_env(inside) == ["MLFLOW_RUN_ID", "SLURMKIT_COMMAND_STOP", "SLURMKIT_RUN_DIR", "WANDB_RUN_ID"]
