"""The job's supervisor without Slurm: its command line, its wait and its passing on of Slurm's
signal. Its restarts run on the dev cluster (test_cluster_faults, test_standby's cluster half)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmkit.common.layout import RunPaths
from slurmkit.common.supervisor_plan import Plan
from slurmkit.slurm import steps
from slurmkit.slurm.steps import Container
from slurmkit.supervisor import loop, main
from tests.conftest import supervisor_events

PLAN = Plan(signal="USR2", launcher="srun", command=["python", "-P", "-u", "-m", "slurmkit.worker.rank", "/f"],
            stdout="/f/%j_%t_log.out", stderr="/f/%j_%t_log.err", tasks_per_node=2, in_job=1,
            budgets={"crash": 1})


def test_container_arrays_pass_whole_even_when_an_item_looks_like_an_option() -> None:
    tail = ["srun-options", "2", "--container-image=x", "--", "rank-prefix", "3", "apptainer", "exec", "-- odd"]
    assert main.container_parts(tail) == Container(["--container-image=x", "--"], ["apptainer", "exec", "-- odd"])
    run_dir, plan, container = main.parse(["--run-dir", "/r", "--plan", PLAN.model_dump_json(), "--", *tail])
    assert (run_dir, plan, container.rank_prefix) == (Path("/r"), PLAN, ["apptainer", "exec", "-- odd"])
    with pytest.raises(ValueError, match="unknown container part"):
        main.container_parts(["nvidia", "0"])


def test_a_step_killed_by_a_signal_exits_as_a_shell_says_it() -> None:
    assert [loop.exit_status(c) for c in (0, 1, -9, -15)] == [0, 1, 137, 143]


def test_outside_a_job_the_supervisor_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(name, raising=False)
    assert main.main(["--run-dir", "/r", "--plan", PLAN.model_dump_json()]) == 2


def test_the_ranks_step_of_a_shrinking_job_runs_on_the_decided_nodes() -> None:
    argv = steps.ranks(PLAN, Container(), 3, ("node2", "node5"))
    assert argv[:3] == ["srun", "--unbuffered", "--kill-on-bad-exit=1"] and argv[-len(PLAN.command):] == PLAN.command
    assert {"--nodes=3", "--ntasks=6", "--exclude=node2,node5"} <= set(argv)
    assert not any(a.startswith(("--nodes", "--exclude")) for a in steps.ranks(PLAN, Container()))


WAITER = """
import subprocess, sys
from pathlib import Path
from slurmkit.common.supervisor_plan import Plan
from slurmkit.common.layout import RunPaths
from slurmkit.slurm.steps import Container
from slurmkit.supervisor.loop import Supervisor

plan = Plan.model_validate_json(sys.argv[2])
sup = Supervisor(plan, RunPaths(Path(sys.argv[1])), "77", Container())
sup._install_signal()
child = subprocess.Popen([sys.executable, "-c", sys.argv[3]])
print("ready", flush=True)
sys.exit(sup._wait(child))
"""

# Stands in for a ranks' step (a plain process, not srun): says when its handler is in, and exits 7 on USR2.
STEP = """
import signal, sys, time
signal.signal(signal.SIGUSR2, lambda *_: sys.exit(7))
open(sys.argv[0] if False else "{ready}", "w").close()
time.sleep(120)
"""


def _waiting_supervisor(tmp_path: Path) -> tuple[RunPaths, subprocess.Popen[str]]:
    """A supervisor (WAITER) waiting on a stand-in step (STEP) whose own handler is in."""
    paths = RunPaths(tmp_path / "run")
    paths.run_dir.mkdir()
    ready = tmp_path / "step-ready"
    proc = subprocess.Popen([sys.executable, "-P", "-c", WAITER, str(paths.run_dir), PLAN.model_dump_json(),
                             STEP.replace("{ready}", str(ready))], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "SLURM_RESTART_COUNT": "0"})
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    while not ready.exists():  # the step's own handler is in
        assert proc.poll() is None
        time.sleep(0.05)
    return paths, proc


def test_slurms_signal_reaches_the_step_and_the_wait_goes_on_until_it_exits(tmp_path: Path) -> None:
    """The signal handler only sets a flag; the loop passes the signal on and returns the step's status."""
    paths, proc = _waiting_supervisor(tmp_path)
    proc.send_signal(signal.SIGUSR2)
    assert proc.wait(timeout=60) == 7
    (forwarded,) = supervisor_events(paths.run_dir, "signal")
    assert (forwarded["signal"], forwarded["job_id"], forwarded["attempt"]) == ("SIGUSR2", "77", 0)
    assert json.loads(paths.supervisor_events.read_text().splitlines()[0])["event"] == "signal"


def test_sigterm_is_noted_and_outlived_not_passed_on(tmp_path: Path) -> None:
    """Slurm sends SIGTERM to the ranks' step itself; the supervisor must outlive it to decide once
    they have saved: the step still runs after it (its SIGTERM would end it with 143), and exits 7
    on the USR2 that follows."""
    paths, proc = _waiting_supervisor(tmp_path)
    proc.send_signal(signal.SIGTERM)
    while not supervisor_events(paths.run_dir, "signal"):  # noted, the supervisor alive
        assert proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR2)
    assert proc.wait(timeout=60) == 7  # the step lived on past the SIGTERM: it was not passed on
    assert [(e["signal"], e["forwarded"]) for e in supervisor_events(paths.run_dir, "signal")] == [
        ("SIGTERM", False), ("SIGUSR2", True)]


def test_a_stop_record_counts_on_the_requeue_signal_whatever_the_exit_and_on_sigterm_only_when_clean() -> None:
    """Rank 0 records the stop. On the requeue signal the step may yet exit non-zero (torchrun dying
    under the ranks' save did): still the stop, never a crash. On SIGTERM, a non-zero exit is srun
    ending the others after a rank died: the failure, not a stop (a kill -9 of a rank once read as
    Slurm's own SIGTERM, and the run was not restarted)."""
    from slurmkit.common.markers import Stopped

    usr2, term = Stopped("77", 0, 0, 12, True, 0.0), Stopped("77", 0, 0, 12, False, 0.0)
    assert loop.a_stop(usr2, 140) is usr2 and loop.a_stop(usr2, 0) is usr2
    assert loop.a_stop(term, 0) is term and loop.a_stop(term, 137) is None
    assert loop.a_stop(None, 0) is None


# A supervisor whose ranks' step is a stand-in: it sends Slurm's SIGTERM to the supervisor (as scancel
# does to the batch step), then exits 143 before any rank wrote a stop record, as srun did.
CANCELLED = """
import subprocess, sys
from pathlib import Path
from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RunFile, RunRecord
from slurmkit.common.supervisor_plan import Plan
from slurmkit.slurm.steps import Container
from slurmkit.supervisor.loop import Supervisor

paths = RunPaths(Path(sys.argv[1]))
paths.job_folder.mkdir(parents=True)
RunFile(paths).create(RunRecord(run_id="run", job_ids=["77"], num_tasks=2,
                                profile={"requeue": {"crash": 3, "in_job": 2, "preemption": 3}}))
sup = Supervisor(Plan.model_validate_json(sys.argv[2]), paths, "77", Container())
step = "import os, signal, time; os.kill(os.getppid(), signal.SIGTERM); time.sleep(0.5); raise SystemExit(143)"
sup._launch = lambda: subprocess.Popen([sys.executable, "-c", step])
sys.exit(sup.run())
"""


def test_after_slurms_sigterm_a_failed_step_is_no_crash_to_restart_or_requeue(tmp_path: Path) -> None:
    """scancel signals the batch step too: the supervisor, outliving its SIGTERM, once took the step's
    exit 143 for a crash, restarted it in the job and requeued the cancelled job. Now the step's end
    is Slurm's stop: no restart, no requeue, nothing noted."""
    from slurmkit.common.record import RunFile

    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-P", "-c", CANCELLED, str(run_dir), PLAN.model_dump_json()],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "SLURM_RESTART_COUNT": "0"})
    assert proc.returncode == 0, proc.stderr
    assert [e["signal"] for e in supervisor_events(run_dir, "signal")] == ["SIGTERM"]
    (decision,) = supervisor_events(run_dir, "decision")
    assert (decision["action"], decision["why"]) == ("end", "slurm_decides")
    record = RunFile(RunPaths(run_dir)).read()
    assert record.failures == [] and record.restarts == []
    assert [e["state"] for e in supervisor_events(run_dir, "state")].count("launch") == 1  # no second step


def test_a_step_that_stopped_on_sigterm_is_decided_as_that_stop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor's loop: a clean SIGTERM stop with no preemption is Slurm's to decide (END,
    slurm_decides): no crash noted, no restart, exit 0."""
    from slurmkit.common.markers import Stopped
    from slurmkit.common.record import RunFile, RunRecord

    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    paths = RunPaths(tmp_path / "run")
    paths.job_folder.mkdir(parents=True)
    RunFile(paths).create(RunRecord(run_id="run", job_ids=["77"], num_tasks=2, profile={"requeue": {"crash": 1}}))
    stand_in_step = ("import sys, time\nfrom pathlib import Path\nfrom slurmkit.common.layout import RunPaths\n"
                     "from slurmkit.common.markers import Stopped\n"
                     "Stopped('77', 0, 0, 12, False, time.time()).write(RunPaths(Path(sys.argv[1])))\n")
    sup = loop.Supervisor(PLAN.model_copy(update={"in_job": 1}), paths, "77", Container())
    monkeypatch.setattr(sup, "_launch", lambda: subprocess.Popen([sys.executable, "-P", "-c", stand_in_step,
                                                                  str(paths.run_dir)]))
    assert sup.run() == 0
    (decision,) = supervisor_events(paths.run_dir, "decision")
    assert (decision["action"], decision["why"], decision["step"]) == ("end", "slurm_decides", 12)
    record = RunFile(paths).read()
    assert record.failures == [] and record.restarts == []  # no crash noted, no in-job restart
    assert Stopped.read(paths, "77", 0, 1) is None and Stopped.read(paths, "77", 1, 0) is None  # another step's: stale
