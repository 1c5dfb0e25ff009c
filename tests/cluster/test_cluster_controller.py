"""slurmctld frozen (SIGSTOP for 12 s, longer than a call's 10 s timeout inside a grace) or restarted
while a `submit --wait` waits and a running job asks for its requeue: the wait ends with the right
state and exit code, the requeue happens."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from slurmkit.common.record import RunFile
from slurmkit.runs import jobs
from slurmkit.runs.lookup import find
from tests.cluster.test_cluster_faults import STEPS, finish, start, wait_step
from tests.conftest import executed_steps, wait_until

pytestmark = pytest.mark.cluster
FREEZE_S = 12  # past a Slurm call's 10 s timeout in a grace, under the dev cluster's MessageTimeout


def ctld_pid() -> int:
    from slurmkit.devcluster import cluster as dc

    return int(dc.status()["daemons"]["slurmctld"]["pid"])


def waiting_submit(tmp_path: Path, profile: Path, command: str) -> subprocess.Popen[str]:
    """`slurmkit submit --wait --json` in its own process, as a user runs it; with a standby step
    (a command keeps no startup watch: it starts STANDBY_UNWATCHED_S, 5 s, after the ranks' step),
    which takes the in-job restart of a failed command at once (a new srun step just after the
    controller's restart waited about 70 s for the nodes to register again)."""
    spec = tmp_path / "waited.yaml"
    spec.write_text(yaml.safe_dump({"name": "waited", "command": command, "resources": {"time": "00:05:00"}}))
    return subprocess.Popen([sys.executable, "-m", "slurmkit", "submit", str(spec), "-p", str(profile), "--wait",
                             "--json", "--set", "profile.requeue.standby=true"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def running(run_root: Path, name: str) -> bool:
    """The run is RUNNING and its supervisor's steps (the ranks', the standby's) exist: stopping the
    controller while srun still creates a step is another test (it left the step's slurmstepd unable
    to reach the controller again, and the job running to its time limit)."""
    # A folder whose run.json is not written yet is no run yet (submit creates the folder first).
    runs = [p for p in run_root.iterdir() if p.name.startswith(name) and (p / "run.json").exists()] \
        if run_root.exists() else []
    if not runs:
        return False
    state = jobs.run_state(find(str(run_root), runs[0].name))
    if state.state != "RUNNING":
        return False
    found = subprocess.run(["squeue", "-h", "--steps", "-j", state.job_id, "-o", "%i"], capture_output=True,
                           text=True, timeout=30).stdout.split()
    return {f"{state.job_id}.0", f"{state.job_id}.1"} <= set(found)


def ended(proc: subprocess.Popen[str]) -> tuple[int, dict[str, object], str]:
    out, err = proc.communicate(timeout=300)
    return proc.returncode, json.loads(out) if proc.returncode == 0 else {}, err


def test_a_frozen_controller_delays_a_wait_and_an_in_job_requeue_but_loses_neither(
        cluster: None, tmp_path: Path, dev_profile: Path, run_root: Path) -> None:
    paths, job = start(dev_profile)
    # The waited job ends once the controller is back: its end surely comes after the freeze, and
    # its step's completion message is not one slurmstepd must send again (a minute later) after
    # meeting the frozen controller, while that step held the CPU the requeued run waits for.
    thawed = tmp_path / "thawed"
    waiter = waiting_submit(tmp_path, dev_profile, f"until [ -e {shlex.quote(str(thawed))} ]; do sleep 0.2; done")
    wait_until(lambda: running(run_root, "waited"), 60, "the waited job to run", 0.5)
    wait_step(paths, 60)
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    # Freeze once the ranks have agreed to stop: the supervisor's preemption check and requeue meet
    # a controller that does not answer past their 10 s timeout. The ranks' step ends inside the
    # freeze; its completion message waits the dev cluster's MessageTimeout (20 s), so it is answered
    # after the thaw rather than sent again a minute later.
    wait_until(lambda: paths.stop_marker.exists(), 60, "the agreed stop")
    pid = ctld_pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(FREEZE_S)
    finally:
        os.kill(pid, signal.SIGCONT)
    thawed.touch()
    code, answer, err = ended(waiter)
    assert code == 0, err
    assert answer["state"] == "COMPLETED" and answer["result"] == {"returncode": 0, "stdout": ""}
    assert finish(paths) == "COMPLETED"
    assert executed_steps(paths.metrics) == list(range(1, STEPS + 1))  # saved at the stop step, none lost
    (restart,) = RunFile(paths).read().restarts
    assert restart.cause == "preemption" and restart.lost_steps == 0


def test_a_wait_outlives_a_controller_restart(cluster: None, tmp_path: Path, dev_profile: Path,
                                             run_root: Path) -> None:
    from slurmkit.devcluster import cluster as dc

    waiter = waiting_submit(tmp_path, dev_profile, "sleep 12; exit 5")  # its standby starts 5 s in
    wait_until(lambda: running(run_root, "waited"), 60, "the waited job to run", 0.5)
    pid = ctld_pid()
    assert dc.stop_daemon("slurmctld")
    try:
        wait_until(lambda: not Path(f"/proc/{pid}").exists(), 30, "slurmctld to stop", 0.2)
        time.sleep(10)  # the job ends while the controller is away
    finally:
        dc.up(2, log=lambda _: None)
    code, _, err = ended(waiter)
    assert code == 4 and "FAILED" in err and "exited with code 5" in err  # the job's own failure, told once
    assert "Traceback" not in err
