"""Observability on the real dev cluster: the health gate (stand-in nvidia-smi: no GPU here) excludes a
bad node on requeue, doctor passes and then fails with a fix when slurmctld is down, and the report of a
run preempted once draws both of its job segments."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from slurmkit.cli.app import app
from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RunFile
from slurmkit.runs import jobs
from slurmkit.slurm import commands
from tests.conftest import ROOT, steady, write_spec

pytestmark = pytest.mark.cluster
runner = CliRunner()


def test_health_gate_failure_requeues_with_the_bad_node_excluded(cluster: None, tmp_path: Path) -> None:
    profile = tmp_path / "gate.yaml"
    profile.write_text(yaml.safe_dump({
        "extends": "devcluster", "run_root": str(tmp_path / "runs"), "health_gate": "always",
        # The stand-in nvidia-smi reports an uncorrectable ECC error on node1 only.
        "setup": {"env": {"STANDIN_GPUS": "2", "STANDIN_ECC": "1:2", "STANDIN_ECC_NODE": "node1"},
                  "commands": [f'export PATH="{ROOT / "tests" / "standins"}:$PATH"']}}))
    # Keep node2 busy, so the job starts on node1 and must fail its gate there.
    blocker = subprocess.run(["sbatch", "--parsable", "-w", "node2", "--exclusive", "--output=/dev/null",
                              "--wrap", "sleep 120"], capture_output=True, text=True, check=True).stdout.strip()
    try:
        spec = write_spec(tmp_path, name="gated", command="hostname", resources={"nodes": 1, "time": "00:05:00"})
        result = runner.invoke(app, ["submit", str(spec), "-p", str(profile), "--json"])
        assert result.exit_code == 0, result.output
        paths = RunPaths(Path(json.loads(result.stdout)["run_dir"]))
        deadline = time.monotonic() + 90
        while not RunFile(paths).read().excluded_nodes:
            assert time.monotonic() < deadline, "the gate never failed"
            time.sleep(0.5)
    finally:
        commands.scancel([blocker])
    final = jobs.wait(paths, poller=steady(0.5), timeout_s=120)
    assert final.state == "COMPLETED"
    assert jobs.result(paths)["stdout"].split() == ["node2"]
    record = RunFile(paths).read()
    assert record.excluded_nodes == ["node1"] and record.exclusion == "excluded node1"
    assert record.unhealthy[0].node == "node1"
    assert "GPU 1 (NVIDIA H200) has 2 uncorrectable ECC errors" in record.unhealthy[0].problems
    assert [r.cause for r in record.restarts] == ["node_failure"]
    shown = commands.run(["scontrol", "show", "job", final.job_id])
    assert "ExcNodeList=node1" in shown


def test_doctor_passes_then_fails_with_a_fix_when_slurmctld_is_down(cluster: None, dev_profile: Path) -> None:
    result = runner.invoke(app, ["doctor", "-p", str(dev_profile), "--json"])
    checks = {c["name"]: c for c in json.loads(result.stdout)}
    assert result.exit_code == 0, result.output
    assert {c["status"] for c in checks.values()} <= {"PASS", "WARN"}
    assert {"slurm", "partition", "munge", "compute-node python", "run_root", "nccl"} <= set(checks)
    assert "imports slurmkit" in checks["compute-node python"]["detail"]
    assert checks["accounting"]["status"] == "PASS" and "slurmdbd" in checks["accounting"]["detail"]

    from slurmkit.devcluster import cluster as dc

    assert dc.stop_daemon("slurmctld")
    try:
        result = runner.invoke(app, ["doctor", "-p", str(dev_profile), "--json"])
        assert result.exit_code == 1
        checks = {c["name"]: c for c in json.loads(result.stdout)}
        assert checks["slurm"]["status"] == "FAIL" and "slurmctld" in checks["slurm"]["fix"]
        assert checks["compute-node python"]["status"] == "SKIP"
        assert checks["munge"]["status"] == "PASS"
        text = runner.invoke(app, ["doctor", "-p", str(dev_profile)]).output
        assert "FAIL  slurm" in text and "fix: start slurmctld" in text
    finally:
        dc.up(2, log=lambda m: print(m, file=sys.stderr))


def test_health_gate_all_reduce_across_both_nodes_passes(cluster: None, tmp_path: Path) -> None:
    profile = tmp_path / "ar.yaml"
    profile.write_text(yaml.safe_dump({"extends": "devcluster", "run_root": str(tmp_path / "runs"),
                                       "health_gate": "always", "health_allreduce": True}))
    spec = write_spec(tmp_path, name="ar", command="hostname",
                      resources={"nodes": 2, "tasks_per_node": 1, "time": "00:05:00"})
    result = runner.invoke(app, ["submit", str(spec), "-p", str(profile), "--wait", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["state"] == "COMPLETED"
    log = RunPaths(Path(out["run_dir"])).rank_log(out["job_id"], 0).read_text()
    assert "slurmkit health: node1 ok (0 GPUs via none, all-reduce ok)" in log
    assert "slurmkit health: node2 ok (0 GPUs via none, all-reduce ok)" in log
