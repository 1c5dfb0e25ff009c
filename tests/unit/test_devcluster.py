"""The dev cluster command: config, root check, idempotent up, down by pid."""

from __future__ import annotations

import subprocess
import time

import pytest
from typer.testing import CliRunner

from slurmkit.cli.app import app
from slurmkit.devcluster import cluster as dc
from slurmkit.devcluster import names
from slurmkit.runs.procs import pid_alive
from slurmkit.slurm import commands

runner = CliRunner()


def test_slurm_conf_declares_every_node_and_the_partition() -> None:
    conf = names.slurm_conf(3)
    assert conf.count("NodeName=node") == 3
    assert "NodeName=node3 NodeAddr=10.77.0.13 NodeHostname=node3" in conf
    assert "PartitionName=debug Nodes=node[1-3] Default=YES MaxTime=60" in conf
    assert "AccountingStorageType=accounting_storage/slurmdbd" in conf
    assert "node3" in names.hosts_block(3) and names.hosts_block(3).startswith(names.HOSTS_BEGIN)


def test_slurm_conf_variants_preemption_no_accounting_and_gres() -> None:
    conf = names.slurm_conf(2)
    assert "PreemptType=preempt/partition_prio" in conf and "GresTypes" not in conf
    assert f"PartitionName={names.URGENT_PARTITION} Nodes=node[1-2]" in conf
    assert "PriorityTier=1 PreemptMode=CANCEL GraceTime=20" in conf and "PriorityTier=10 PreemptMode=OFF" in conf
    bare = names.slurm_conf(2, names.Variant(accounting=False, min_job_age_s=5))
    assert "AccountingStorageType=accounting_storage/none" in bare and "AccountingStorageHost" not in bare
    assert "MinJobAge=5" in bare
    gpus = names.slurm_conf(2, names.Variant(gpus_per_node=2))
    assert "GresTypes=gpu" in gpus and gpus.count(" Gres=gpu:2 ") == 2
    assert names.gres_conf(2, 2).endswith(f"NodeName=node[1-2] Name=gpu File={names.GPU_DEVICES}/nvidia[0-1]\n")
    assert names.gres_conf(2, 1).endswith("/nvidia0\n")
    assert "SlurmctldParameters=preempt_send_user_signal" not in conf
    assert "SlurmctldParameters=preempt_send_user_signal\n" in names.slurm_conf(2, names.Variant(
        preempt_user_signal=True))


def test_not_root_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dc.os, "geteuid", lambda: 1000)
    result = runner.invoke(app, ["devcluster", "up"])
    assert result.exit_code == 2
    assert "needs root" in result.output and len(result.output.strip().splitlines()) == 1


def test_a_reused_pid_is_not_taken_for_our_daemon() -> None:
    with subprocess.Popen(["sleep", "30"]) as other:
        try:
            assert pid_alive(other.pid)
            assert not dc.ours("slurmd-node1", other.pid)
            assert not dc.ours("munged", other.pid)
        finally:
            other.kill()


@pytest.mark.cluster
def test_up_again_changes_nothing(cluster: None) -> None:
    before = dc.status()
    assert all(d["alive"] for d in before["daemons"].values())
    assert before["node_states"] == {"node1": "idle", "node2": "idle"}
    result = runner.invoke(app, ["devcluster", "up"])
    assert result.exit_code == 0, result.output
    assert "starting" not in result.output
    after = dc.status()
    assert {k: v["pid"] for k, v in after["daemons"].items()} == {k: v["pid"] for k, v in before["daemons"].items()}


@pytest.mark.cluster
def test_down_stops_only_what_up_started_then_up_restores(cluster: None) -> None:
    pids = {k: v["pid"] for k, v in dc.status()["daemons"].items()}
    with subprocess.Popen(["sleep", "60"]) as bystander:
        try:
            result = runner.invoke(app, ["devcluster", "down"])
            assert result.exit_code == 0, result.output
            assert not any(pid_alive(p) for p in pids.values())
            assert pid_alive(bystander.pid)
            assert not commands.ping()["up"]
        finally:
            bystander.kill()
            up = runner.invoke(app, ["devcluster", "up"])
    assert up.exit_code == 0, up.output
    deadline = time.monotonic() + 30
    while not commands.ping()["up"] and time.monotonic() < deadline:
        time.sleep(0.5)
    st = dc.status()
    assert all(d["alive"] for d in st["daemons"].values())
    assert {st["node_states"].get("node1"), st["node_states"].get("node2")} == {"idle"}
