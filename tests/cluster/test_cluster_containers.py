"""Containers on the real dev cluster: sbatch accepts the scripts, and the docker and apptainer paths run
for real through stand-in executables (no container runtime here) that record their argv."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from slurmkit.cli.app import app
from slurmkit.common.layout import RunPaths
from slurmkit.load.loader import resolve
from slurmkit.runs import jobs
from tests.conftest import EXAMPLES, ROOT
from tests.unit.test_containers import CONTAINERS

pytestmark = pytest.mark.cluster
runner = CliRunner()
STANDINS = ROOT / "tests" / "standins"


def container_profile(tmp_path: Path, container: dict[str, Any]) -> Path:
    logs = tmp_path / "argv"
    logs.mkdir(exist_ok=True)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({
        "extends": "devcluster", "run_root": str(tmp_path / "runs"), "container": container,
        "setup": {"env": {"STANDIN_LOG_DIR": str(logs)}, "commands": [f'export PATH="{STANDINS}:$PATH"']}}))
    return path


@pytest.mark.parametrize("runtime", ["apptainer", "docker"])
def test_sbatch_accepts_the_container_script(cluster: None, tmp_path: Path, runtime: str) -> None:
    resolved = resolve(EXAMPLES / "hostnames.yaml", str(container_profile(tmp_path, CONTAINERS[runtime])))
    script = tmp_path / "job.sh"
    script.write_text(jobs.dry_run(resolved).script)
    proc = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and "to start at" in proc.stderr, proc.stderr


@pytest.mark.parametrize("runtime", ["apptainer", "docker"])
def test_ranks_run_through_the_stand_in_runtime_with_mounts_and_gpu_flags(
        cluster: None, tmp_path: Path, runtime: str) -> None:
    container = {**CONTAINERS[runtime], "gpus": True, "mounts": [f"{tmp_path}:/data:ro"]}
    profile = container_profile(tmp_path, container)
    result = runner.invoke(app, ["submit", str(EXAMPLES / "hostnames.yaml"), "-p", str(profile), "--wait", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["state"] == "COMPLETED"
    assert out["result"]["stdout"].split() == ["node1"]  # rank 0's command ran, through the stand-in
    runs = str(tmp_path / "runs")
    for rank in (0, 1):
        argv = (tmp_path / "argv" / f"{runtime}.{rank}.argv").read_text().splitlines()
        image = argv.index(container["image"])
        options, command = argv[:image], argv[image + 1:]
        assert command[1:5] == ["-P", "-u", "-m", "slurmkit.worker.rank"]
        if runtime == "docker":
            assert options[:5] == ["run", "--rm", "--network", "host", "--ipc"]
            pairs = set(zip(options, options[1:], strict=False))
            assert {("-v", f"{tmp_path}:/data:ro"), ("-v", f"{runs}:{runs}"), ("--gpus", "all"),
                    ("-e", "SLURM_PROCID"), ("-e", "SLURMKIT_SIGNAL"), ("-e", "HF_HOME"), ("-w", "/work")} <= pairs
            assert options[-1] == "--shm-size=8g"
        else:
            assert options[:2] == ["exec", "--nv"]
            binds = options[options.index("--bind") + 1].split(",")
            assert binds[0] == f"{tmp_path}:/data:ro" and f"{runs}:{runs}" in binds
            assert options[options.index("--pwd") + 1] == "/work"
            assert "HF_HOME=/data/hf cache" in options
    assert jobs.run_state(RunPaths(Path(out["run_dir"]))).state == "COMPLETED"


def test_a_heterogeneous_runs_part_runs_in_its_own_container(cluster: None, tmp_path: Path) -> None:
    """The rollout part in the (stand-in) apptainer, the trainer on the host: only the rollout's ranks
    go through the runtime, each with its own part's worker."""
    logs = tmp_path / "argv"
    logs.mkdir()
    profile = tmp_path / "p.yaml"
    profile.write_text(yaml.safe_dump({
        "extends": "devcluster", "run_root": str(tmp_path / "runs"),
        "setup": {"env": {"STANDIN_LOG_DIR": str(logs)}, "commands": [f'export PATH="{STANDINS}:$PATH"']}}))
    spec = {"name": "rlc", "resources": {"time": "00:05:00"}, "components": {
        # The trainer (the primary: its end ends the rollout) waits for both rollout ranks' marks.
        "trainer": {"command": f"until [ -e {tmp_path}/up.0 ] && [ -e {tmp_path}/up.1 ]; do sleep 0.2; done; "
                               "echo trainer on $(hostname)"},
        "rollout": {"command": f"echo rollout rank $SLURM_PROCID; touch {tmp_path}/up.$SLURM_PROCID; sleep 60",
                    "resources": {"tasks_per_node": 2},
                    "container": CONTAINERS["apptainer"]}}}
    sub = jobs.submit(resolve(spec, str(profile)))
    paths, job = RunPaths(Path(sub.run_dir)), sub.job_id or ""
    assert jobs.wait(paths, timeout_s=180).state == "COMPLETED"
    assert sorted(p.name for p in logs.iterdir()) == ["apptainer.0.argv", "apptainer.1.argv"]  # the rollout's 2
    for rank in (0, 1):
        argv = (logs / f"apptainer.{rank}.argv").read_text().splitlines()
        assert argv[:2] == ["exec", "--nv"] and CONTAINERS["apptainer"]["image"] in argv
        assert argv[-1] == str(paths.part("rollout").job_folder)  # the rollout part's own worker
        assert f"rollout rank {rank}" in paths.part("rollout").rank_log(job, rank).read_text()
    assert "trainer on node1" in paths.rank_log(job, 0).read_text()
