"""Waiting on Slurm without a cluster: the Poller's rate over a long wait (a simulated clock), and
queries that survive a controller hiccup (stand-in Slurm binaries: a hiccup on demand is what the
real daemons cannot give a unit test; the real-cluster waits are in the cluster tests)."""

from __future__ import annotations

import os
import stat
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from slurmkit.errors import SlurmError
from slurmkit.runs.polling import Poller
from slurmkit.slurm import commands


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def queries_per_minute(first_s: float, minutes: int, max_s: float = 30.0) -> Counter[int]:
    clock = Clock()
    poller = Poller(first_s=first_s, max_s=max_s, clock=clock, sleep=clock.sleep)
    per_minute: Counter[int] = Counter()
    while clock.now < minutes * 60:
        per_minute[int(clock.now // 60)] += 1  # one query, then the wait before the next
        poller.wait()
    return per_minute


def test_a_long_wait_queries_less_and_less_down_to_the_cap() -> None:
    per_minute = queries_per_minute(1.0, 10)
    assert sum(per_minute.values()) < 60  # 10 minutes at a fixed 1 s would be 600
    assert per_minute[0] <= 30
    assert all(per_minute[m + 1] <= per_minute[m] for m in range(9)), per_minute
    assert per_minute[9] == 2  # 60 s / max_s
    # A job that ends is noticed within a tenth of the time waited (or first_s).
    clock = Clock()
    poller = Poller(first_s=1.0, clock=clock, sleep=clock.sleep)
    for _ in range(200):
        before = clock.now
        poller.wait()
        assert clock.now - before <= max(1.0, 0.1 * clock.now)


def test_due_spaces_queries_in_a_loop_that_wakes_often() -> None:
    clock = Clock()
    poller = Poller(first_s=2.0, clock=clock, sleep=clock.sleep)
    due = []
    for _ in range(100):  # a follow loop reading files every 0.5 s for 50 s
        due.append(poller.due())
        clock.sleep(0.5)
    assert due[0] and sum(due) <= 50 / 2.0 + 1


def stand_in(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text("#!/bin/bash\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def hiccup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """squeue and scancel stand-ins that fail like a restarting controller the first `$FAILS` times."""
    body = ('n=$(cat "$STATE/count" 2>/dev/null || echo 0); echo $((n + 1)) > "$STATE/count"\n'
            'if [ "$n" -lt "$FAILS" ]; then echo "${MESSAGE:-slurm_load_jobs error: Unable to contact slurm '
            'controller (connect failure)}" >&2; exit 1; fi\n')
    stand_in(tmp_path, "squeue", body + 'case "$*" in *--format=%L*) echo "10:00";; '
             '*) echo "7|RUNNING|None|node1|0:05|7";; esac\n')
    stand_in(tmp_path, "scancel", body)
    pending = 'if [ -n "${PENDING:-}" ]; then echo "Job is pending execution for job 7" >&2; exit 1; fi\n'
    stand_in(tmp_path, "scontrol", body + pending)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STATE", str(tmp_path))
    monkeypatch.setattr(commands, "QUERY_WAIT", {"multiplier": 0.0, "max": 0.0, "jitter": 0.0})
    return tmp_path


def test_a_query_survives_a_controller_hiccup_stand_in_squeue(hiccup: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAILS", "2")
    with commands.counting() as calls:
        jobs = commands.squeue_all()
    assert jobs["7"].state == "RUNNING" and calls["squeue"] == 3
    (hiccup / "count").unlink()
    monkeypatch.setenv("FAILS", "3")  # longer than the retries: one clear error
    with pytest.raises(SlurmError, match="Unable to contact slurm controller"):
        commands.squeue_all()


def test_a_command_that_changes_state_is_never_repeated_stand_in_scancel(
        hiccup: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAILS", "1")
    with commands.counting() as calls, pytest.raises(SlurmError, match="scancel 7 failed"):
        commands.scancel(["7"])
    assert calls["scancel"] == 1


def test_an_in_job_requeue_is_retried_within_the_grace_left_stand_in_scontrol(
        hiccup: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def scontrol_calls(fails: int) -> int:
        (hiccup / "count").unlink(missing_ok=True)
        monkeypatch.setenv("FAILS", str(fails))
        with commands.counting() as calls:
            commands.requeue("7", within_s=20)
        return calls["scontrol"]

    assert scontrol_calls(2) == 3
    # A try that failed on the way back but went through: the next one finds the job requeued.
    monkeypatch.setenv("PENDING", "1")
    assert scontrol_calls(1) == 2
    # What a slurmctld thawed after SIGSTOP answered the first call after its backlog, having
    # requeued the job (seen here): the same.
    monkeypatch.setenv("MESSAGE", "scontrol: error: Unexpected message received for job 7")
    assert scontrol_calls(1) == 2
    monkeypatch.delenv("MESSAGE")
    # First time, "pending execution" is a real error; and without a grace nothing is repeated.
    (hiccup / "count").unlink()
    monkeypatch.setenv("FAILS", "0")
    with pytest.raises(SlurmError, match="pending execution"):
        commands.requeue("7", within_s=20)
    (hiccup / "count").unlink()
    monkeypatch.setenv("FAILS", "1")
    with commands.counting() as calls, pytest.raises(SlurmError, match="Unable to contact"):
        commands.requeue("7")
    assert calls["scontrol"] == 1


def test_a_requeue_that_may_have_gone_through_keeps_its_marker_stand_in_scontrol(
        hiccup: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """slurmctld stopped by SIGSTOP reads a timed-out try once it runs again, and requeues the job:
    the marker with the restart's cause must outlive the failed call (it once came back `requeue`)."""
    import json

    from slurmkit.common.cause import Cause
    from slurmkit.common.layout import RunPaths
    from slurmkit.common.record import RunFile, RunRecord
    from slurmkit.supervisor import effects, policy
    from slurmkit.supervisor.decision import Action, Decision

    monkeypatch.setenv("FAILS", "1000")
    with commands.counting() as calls, pytest.raises(commands.RequeueUncertain, match="may still go through"):
        commands.requeue("7", within_s=1.5)
    assert calls["scontrol"] >= 2
    paths = RunPaths(hiccup / "run")
    paths.job_folder.mkdir(parents=True)
    RunFile(paths).create(RunRecord(run_id="run", job_ids=["7"], profile={"requeue": {"preemption": 1}}))
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    asked = Decision(Action.REQUEUE, Cause.PREEMPTION, 12, within_s=3)
    with pytest.raises(commands.RequeueUncertain):
        effects.requeue(paths, "7", asked)
    assert json.loads(paths.restart_request.read_text())["cause"] == "preemption"
    # A failure that reached nobody leaves no marker behind.
    monkeypatch.setenv("FAILS", "0")
    monkeypatch.setenv("PENDING", "1")
    with pytest.raises(SlurmError, match="pending execution") as failed:
        effects.requeue(paths, "7", asked)
    assert not isinstance(failed.value, commands.RequeueUncertain) and not paths.restart_request.exists()
    # The supervisor, after the ranks stopped and saved, says either in one line rather than a traceback.
    monkeypatch.setattr(policy, "IN_JOB_RETRY_S", 3.0)
    stopped = policy.StepStopped(12, True, None, None)  # squeue did not answer: time left unknown
    failed_decision = effects.decide(paths, "7", stopped)
    assert (failed_decision.action, failed_decision.why, failed_decision.step) == (Action.END, "slurm_failed", 12)
    monkeypatch.setenv("FAILS", "1000")
    monkeypatch.delenv("PENDING")
    uncertain = effects.decide(paths, "7", stopped)
    assert (uncertain.action, uncertain.why, uncertain.step) == (Action.REQUEUE, "uncertain", 12)
    assert "\n" not in uncertain.message  # one line in the job's log


def test_until_ended_stops_at_the_end_at_the_timeout_and_after_the_unknown_grace() -> None:
    from slurmkit.runs.polling import UNKNOWN_GRACE_S

    def run(answers: list[set[str]], timeout_s: float | None = None) -> tuple[int, float]:
        clock = Clock()
        poller = Poller(first_s=1.0, clock=clock, sleep=clock.sleep)
        seen = iter(answers)
        last = poller.until_ended(lambda: next(seen, answers[-1]), lambda states: states, timeout_s)
        return answers.index(last) if last in answers else -1, clock.now

    assert run([{"RUNNING"}, {"RUNNING"}, set()])[0] == 2  # the first answer with nothing live
    assert run([{"RUNNING"}], timeout_s=50)[1] > 50  # never ends: gives up after the timeout
    _, waited = run([{"RUNNING"}, {"UNKNOWN"}])  # only unknown jobs left: gives up after the grace
    assert UNKNOWN_GRACE_S < waited < 2 * UNKNOWN_GRACE_S


def test_a_wait_rides_out_a_controller_outage_with_one_warning(capsys: pytest.CaptureFixture[str]) -> None:
    clock = Clock()
    down = commands.TransientSlurmError("squeue failed: Unable to contact slurm controller")
    answers: list[Any] = [down, down, down, {"RUNNING"}, commands.TransientSlurmError("Socket timed out"), set()]
    asked: list[Any] = []

    def query() -> set[str]:
        asked.append(answers[len(asked)])
        if isinstance(asked[-1], Exception):
            raise asked[-1]
        return set(asked[-1])

    survive = (commands.TransientSlurmError,)
    assert Poller(clock=clock, sleep=clock.sleep).until_ended(query, lambda s: s, survive=survive) == set()
    assert len(asked) == 6  # every failed poll was asked again, up to the end
    err = capsys.readouterr().err
    assert err.count("still waiting") == 2 and "Unable to contact" in err and "Socket timed out" in err

    def never() -> set[str]:
        raise down

    with pytest.raises(commands.TransientSlurmError):  # past the wait's timeout the error stands
        Poller(clock=clock, sleep=clock.sleep).until_ended(never, lambda s: s, timeout_s=5.0, survive=survive)


def test_on_change_emits_each_transition_once() -> None:
    from slurmkit.runs.polling import on_change

    lines: list[str] = []
    seen = on_change(str.upper, lines.append)
    for answer in ["pending", "pending", "running", "running", "running", "completed"]:
        seen(answer)
    assert lines == ["PENDING", "RUNNING", "COMPLETED"]
    clock = Clock()
    answers = iter(["pending", "running", "done"])
    polled: list[str] = []
    Poller(first_s=1.0, clock=clock, sleep=clock.sleep).until_ended(
        lambda: next(answers), lambda a: set() if a == "done" else {a}, on_answer=polled.append)
    assert polled == ["pending", "running", "done"]  # every answer, the last one included


@pytest.mark.parametrize(("outcomes", "state"), [(["success", "success"], "COMPLETED"),
                                                 (["success", "error"], "FAILED"), ([], "UNKNOWN")])
def test_a_failing_sacct_is_a_warning_and_the_run_folder_decides_stand_in_sacct(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        outcomes: list[str], state: str) -> None:
    """No accounting (or sacct failing): status goes on from squeue and what the ranks recorded."""
    from slurmkit.common import outcomes as oc
    from slurmkit.common.layout import RunPaths
    from slurmkit.common.record import RunFile, RunRecord
    from slurmkit.runs import jobs

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in(bin_dir, "squeue", "exit 0\n")  # the job has left the queue
    stand_in(bin_dir, "sacct", 'echo "sacct: error: Problem talking to the database: Connection refused" >&2\nexit 1\n')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(commands, "QUERY_WAIT", {"multiplier": 0.0, "max": 0.0, "jitter": 0.0})
    paths = RunPaths(tmp_path / "runs" / "r-1")
    paths.run_dir.mkdir(parents=True)
    RunFile(paths).create(RunRecord(run_id="r-1", executor="slurm", num_tasks=2, job_ids=["77"]))
    for rank, kind in enumerate(outcomes):
        oc.record(paths.outcome_file("77", rank), kind, value=1, error="boom" if kind == "error" else "")
    monkeypatch.setattr(commands, "_SACCT_WARNED", set())
    (status,) = jobs.status(str(tmp_path / "runs"))
    assert status.state == state
    assert jobs.status(str(tmp_path / "runs"))[0].state == state  # a --wait polls again: warned once
    assert capsys.readouterr().err.count("warning: sacct failed") == 1


@pytest.mark.parametrize("marked", [True, False])
def test_a_preempted_run_ends_and_says_how_to_resume_stand_in_squeue(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, marked: bool) -> None:
    """Slurm's PREEMPTED (the grace ran out) is an end, as is a COMPLETED job whose rank 0 marked
    it preempted under PreemptMode=CANCEL; either way `result` names `slurmkit resubmit`."""
    from slurmkit.common.layout import RunPaths
    from slurmkit.common.record import Preempted, RunFile, RunRecord
    from slurmkit.errors import JobFailedError
    from slurmkit.runs import jobs

    state = "COMPLETED" if marked else "PREEMPTED"
    stand_in(tmp_path, "squeue", f'echo "77|{state}|None|node1|0:05|0"\n')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    paths = RunPaths(tmp_path / "runs" / "r-1")
    paths.run_dir.mkdir(parents=True)
    marker = Preempted(job_id="77", step=9, detail="PreemptMode=CANCEL") if marked else None
    RunFile(paths).create(RunRecord(run_id="r-1", executor="slurm", job_ids=["77"], preempted=marker))
    assert jobs.run_state(paths).state == "PREEMPTED" and not jobs.is_active("PREEMPTED")
    with pytest.raises(JobFailedError, match="preempted") as err:
        jobs.result(paths)
    assert "slurmkit resubmit r-1" in err.value.one_line()
