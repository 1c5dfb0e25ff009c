"""A cluster without accounting (no slurmdbd, AccountingStorageType=accounting_storage/none),
started by `devcluster up --no-accounting`: runs, sweeps and the requeue policy work from squeue
and what the run folders record, once finished jobs have left squeue too (MinJobAge 5 s here)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from slurmkit.cli.app import app
from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RunFile
from slurmkit.runs import jobs
from tests.cluster.test_cluster_faults import STEPS, finish, start, wait_step
from tests.conftest import executed_steps, wait_until

pytestmark = pytest.mark.cluster
runner = CliRunner()
MIN_JOB_AGE_S = 5


@pytest.fixture(scope="module")
def no_accounting(cluster: None) -> Iterator[None]:
    from slurmkit.devcluster import cluster as dc
    from slurmkit.devcluster.names import Variant

    dc.up(2, log=lambda _: None, variant=Variant(accounting=False, min_job_age_s=MIN_JOB_AGE_S))
    try:
        yield
    finally:
        dc.up(2, log=lambda _: None)  # back to the suite's cluster, slurmdbd and all


def cli(*args: str, code: int = 0) -> Any:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == code, result.output
    return json.loads(result.stdout) if code == 0 else result


def left_squeue(*job_ids: str) -> bool:
    out = subprocess.run(["squeue", "--noheader", "--states=all", "--format=%i"], capture_output=True, text=True,
                         check=True).stdout.split()
    return not any(j.split("_")[0] in {o.split("_")[0] for o in out} for j in job_ids)


def spec(tmp_path: Path, name: str, command: str, sweep: dict[str, Any] | None = None) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "command": command, "resources": {"time": "00:05:00"},
                                    **({"sweep": sweep} if sweep else {})}))
    return path


def test_no_sacct_there_and_doctor_says_what_is_degraded(no_accounting: None, dev_profile: Path) -> None:
    sacct = subprocess.run(["sacct", "-X", "-n"], capture_output=True, text=True)
    assert sacct.returncode != 0 or not sacct.stdout.strip()  # nothing to ask
    checks = {c["name"]: c for c in json.loads(runner.invoke(app, ["doctor", "-p", str(dev_profile),
                                                                   "--json"]).stdout)}
    assert checks["accounting"]["status"] == "WARN" and "accounting_storage/none" in checks["accounting"]["detail"]


def test_runs_without_accounting_wait_status_result_logs_list(
        no_accounting: None, tmp_path: Path, dev_profile: Path) -> None:
    ok = cli("submit", str(spec(tmp_path, "na-ok", "echo hello-from-$SLURM_PROCID")), "-p", str(dev_profile),
             "--wait")
    assert ok["state"] == "COMPLETED"
    bad = cli("submit", str(spec(tmp_path, "na-bad", "exit 3")), "-p", str(dev_profile),
              "--set", "profile.requeue.crash=0", "--wait", code=4)
    assert "FAILED" in bad.output and "Traceback" not in bad.output
    bad_run = next(p for p in (dev_profile.parent / "runs").iterdir() if p.name.startswith("na-bad"))
    bad_job = RunFile(RunPaths(bad_run)).read().job_ids[-1]
    wait_until(lambda: left_squeue(ok["job_id"], bad_job), 120, "the jobs to leave squeue", 1.0)
    # Neither squeue nor sacct knows them now: the ranks' outcome records decide; the rest is unknown.
    rows = {r["run_id"]: r for r in cli("status", "-p", str(dev_profile))}
    assert rows[ok["run_id"]]["state"] == "COMPLETED" and rows[bad_run.name]["state"] == "FAILED"
    assert rows[ok["run_id"]]["goodput"] is None and rows[ok["run_id"]]["elapsed"] == ""
    assert cli("result", ok["run_id"], "-p", str(dev_profile)) == {"returncode": 0, "stdout": "hello-from-0\n"}
    logs = runner.invoke(app, ["logs", ok["run_id"], "-p", str(dev_profile)])
    assert logs.exit_code == 0 and "hello-from-0" in logs.output
    listed = {r["run_id"]: r["state"] for r in cli("list", "-p", str(dev_profile))}
    assert listed[ok["run_id"]] == "COMPLETED" and listed[bad_run.name] == "FAILED"


def test_a_sweep_without_accounting_status_results_and_resubmit_failed(
        no_accounting: None, tmp_path: Path, dev_profile: Path) -> None:
    from slurmkit.common import sweep_layout

    command = 'if [ "$MODE" = flaky ] && [ ! -e "$SLURMKIT_RUN_DIR/fixed" ]; then exit 3; fi; echo "{\\"v\\": 1}"'
    path = spec(tmp_path, "na-sweep", command, {"grid": {"env.MODE": ["ok", "flaky", "fine"]}})
    done = cli("sweep", str(path), "-p", str(dev_profile), "--set", "profile.requeue.crash=0", "--wait")
    assert done["counts"] == {"COMPLETED": 2, "FAILED": 1}
    paths = sweep_layout.SweepPaths(Path(done["sweep_dir"]))
    array = sweep_layout.Manifest(paths).read().arrays[0].job_id
    assert array is not None
    wait_until(lambda: left_squeue(array), 120, "the array to leave squeue", 1.0)
    status = cli("sweep", "status", paths.sweep_id, "-p", str(dev_profile))
    assert [t["state"] for t in status["tasks"]] == ["COMPLETED", "FAILED", "COMPLETED"]
    rows = cli("sweep", "results", paths.sweep_id, "-p", str(dev_profile))
    assert [r["state"] for r in rows] == ["COMPLETED", "FAILED", "COMPLETED"]
    (paths.task(1).run_dir / "fixed").write_text("")
    assert cli("sweep", "resubmit", paths.sweep_id, "--failed", "-p", str(dev_profile))["resubmitted"] == [1]
    wait_until(lambda: cli("sweep", "status", paths.sweep_id, "-p", str(dev_profile))["counts"] == {"COMPLETED": 3},
               180, "the resubmitted task", 1.0)


def test_the_requeue_policy_without_accounting(no_accounting: None, dev_profile: Path) -> None:
    """The cause of a restart comes from the marker the requester wrote: no sacct is needed."""
    paths, job = start(dev_profile)
    wait_step(paths, 60)
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    assert finish(paths) == "COMPLETED"
    assert executed_steps(paths.metrics) == list(range(1, STEPS + 1))  # stopped at the agreed step: none lost
    result = jobs.result(paths)
    assert result["restart_causes"] == ["preemption"] and result["steps"] == STEPS
    (restart,) = RunFile(paths).read().restarts
    assert restart.lost_steps == 0 and restart.detail.startswith("signal with")  # the marker's detail
