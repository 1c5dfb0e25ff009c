"""Observability on the real dev cluster: the health gate (stand-in nvidia-smi: no GPU here) excludes a
bad node on requeue, doctor passes and then fails with a fix when slurmctld is down, and the report of a
run preempted once draws both of its job segments."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from slurmkit.cli.app import app
from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RunFile
from slurmkit.runs import jobs
from slurmkit.slurm import commands
from tests.conftest import ROOT, steady, wait_until, write_spec

pytestmark = pytest.mark.cluster
runner = CliRunner()


def gated_profile(tmp_path: Path) -> Path:
    profile = tmp_path / "gate.yaml"
    profile.write_text(yaml.safe_dump({
        "extends": "devcluster", "run_root": str(tmp_path / "runs"), "health_gate": "always",
        # The stand-in nvidia-smi reports an uncorrectable ECC error on node1 only.
        "setup": {"env": {"STANDIN_GPUS": "2", "STANDIN_ECC": "1:2", "STANDIN_ECC_NODE": "node1"},
                  "commands": [f'export PATH="{ROOT / "tests" / "standins"}:$PATH"']}}))
    return profile


def gate_fails_on_node1(tmp_path: Path, profile: Path, name: str) -> RunPaths:
    """A one-node run sent to node1 (node2 kept busy meanwhile), whose health gate fails there."""
    blocker = subprocess.run(["sbatch", "--parsable", "-w", "node2", "--exclusive", "--output=/dev/null",
                              "--wrap", "sleep 120"], capture_output=True, text=True, check=True).stdout.strip()
    try:
        spec = write_spec(tmp_path, filename=f"{name}.yaml", name=name, command="hostname",
                          resources={"nodes": 1, "time": "00:05:00"})
        result = runner.invoke(app, ["submit", str(spec), "-p", str(profile), "--json"])
        assert result.exit_code == 0, result.output
        paths = RunPaths(Path(json.loads(result.stdout)["run_dir"]))
        wait_until(lambda: RunFile(paths).read().excluded_nodes, 90, "the gate to fail")
    finally:
        commands.scancel([blocker])
    return paths


def test_health_gate_failure_requeues_with_the_bad_node_excluded(cluster: None, tmp_path: Path) -> None:
    paths = gate_fails_on_node1(tmp_path, gated_profile(tmp_path), "gated")
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


def test_a_node_that_failed_the_gate_in_two_runs_is_kept_out_of_the_third(cluster: None, tmp_path: Path) -> None:
    """The user's node ledger remembers each failed gate; the next submit leaves node1 out from the
    start (sbatch --exclude), and `slurmkit nodes` shows why; --forget clears it."""
    profile = gated_profile(tmp_path)
    for name in ("first", "second"):
        paths = gate_fails_on_node1(tmp_path, profile, name)
        jobs.cancel(paths)
    listed = runner.invoke(app, ["nodes", "-p", str(profile), "--json"])
    assert listed.exit_code == 0, listed.output
    (node1,) = json.loads(listed.stdout)
    assert (node1["node"], node1["blames"], node1["excluded"]) == ("node1", 2, True)
    spec = write_spec(tmp_path, filename="third.yaml", name="third", command="hostname",
                      resources={"nodes": 1, "time": "00:05:00"})
    result = runner.invoke(app, ["submit", str(spec), "-p", str(profile), "--wait", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    third = RunPaths(Path(out["run_dir"]))
    assert out["state"] == "COMPLETED" and RunFile(third).read().restarts == []  # no gate failed: never on node1
    assert "--exclude=node1" in third.script.read_text()
    forgot = runner.invoke(app, ["nodes", "-p", str(profile), "--forget", "node1", "--json"])
    assert json.loads(forgot.stdout) == {"node": "node1", "forgotten": 2}
    assert json.loads(runner.invoke(app, ["nodes", "-p", str(profile), "--json"]).stdout) == []


def test_doctor_passes_then_fails_with_a_fix_when_slurmctld_is_down(cluster: None, dev_profile: Path) -> None:
    result = runner.invoke(app, ["doctor", "-p", str(dev_profile), "--json"])
    checks = {c["name"]: c for c in json.loads(result.stdout)}
    assert result.exit_code == 0, result.output
    assert {c["status"] for c in checks.values()} <= {"PASS", "WARN"}
    assert {"slurm", "partition", "munge", "compute-node python", "run_root", "nccl"} <= set(checks)
    assert "imports slurmkit" in checks["compute-node python"]["detail"]
    assert checks["package drift"]["status"] == "PASS"  # the nodes run this very environment
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
