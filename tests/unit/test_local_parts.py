"""A heterogeneous run on the local profile (issue 64, item 4): its parts as local process groups under
one supervisor (slurmkit.supervisor.local_parts), the docs' own RL example: each part its own world,
the trainer completing ends the rollout, the profile's signal stops both and the run starts again
once (one decision, by the trainer's rank 0), a part that fails ends the run, and a cancel ends
every process of the run, which a resubmit brings back; a sweep of it, each task such a run."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

from typer.testing import CliRunner

import slurmkit
from slurmkit.cli.app import app
from slurmkit.common.layout import RunPaths
from slurmkit.common.metrics import iter_records
from slurmkit.common.record import RunFile
from slurmkit.common.sweep_layout import SweepPaths
from slurmkit.runs import procs
from slurmkit.runs.jobs.status import run_state
from slurmkit.sweeps import results
from tests.conftest import wait_until

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def submit(local_profile: Path, *sets: str) -> tuple[RunPaths, str, str]:
    """examples/rl.yaml submitted from its folder (its commands name rl_loop.py there)."""
    here = Path.cwd()
    os.chdir(EXAMPLES)
    try:
        result = runner.invoke(app, ["submit", "rl.yaml", "-p", str(local_profile), "--json",
                                     *(a for s in sets for a in ("--set", s))])
    finally:
        os.chdir(here)
    assert result.exit_code == 0, result.output
    sub = json.loads(result.stdout)
    return RunPaths(Path(sub["run_dir"])), sub["run_id"], sub["job_id"]


def trainer_log(paths: RunPaths, job_id: str) -> str:
    path = paths.rank_log(job_id, 0)
    return path.read_text() if path.exists() else ""


def steps_of(paths: RunPaths, job_ids: list[str]) -> list[int]:
    return [int(s) for j in job_ids for s in re.findall(r"^trainer step=(\d+) sample", trainer_log(paths, j), re.M)]


def events(paths: RunPaths, kind: str) -> list[dict[str, object]]:
    return [e for e in iter_records(paths.supervisor_events) if e.get("event") == kind]


def test_two_local_parts_talk_and_the_trainer_completing_ends_the_rollout(local_profile: Path) -> None:
    paths, run_id, job_id = submit(local_profile, "components.trainer.command=python rl_loop.py trainer --steps 8")
    job = slurmkit.Job.from_id(run_id, profile=str(local_profile))
    assert job.wait(timeout=300) == "COMPLETED"
    log = trainer_log(paths, job_id)
    # Every step's sample came from the rollout part's rank 0, over TCP at SLURMKIT_ROLLOUT_HOST, in a
    # world of its own (2 ranks; the trainer's is 1), on a port of its own.
    assert steps_of(paths, [job_id]) == list(range(1, 9))
    assert all("world=2" in line for line in log.splitlines() if line.startswith("trainer step="))
    (hello,) = re.findall(r"^trainer rank=0 world=1 .* port=(\d+) rollout=(\S+) mine=\['trainer'\]", log, re.M)
    rollout = paths.part("rollout")
    ports = set(re.findall(r"^rollout rank=\d world=2 port=(\d+)", rollout.rank_log(job_id, 0).read_text()
                           + rollout.rank_log(job_id, 1).read_text(), re.M))
    assert len(ports) == 1 and hello[0] not in ports and hello[1] == "127.0.0.1"
    ended = {str(e["part"]): e for e in events(paths, "part_ended")}
    assert ended["trainer"]["exit_code"] == 0 and not ended["trainer"]["by_job"]
    assert ended["rollout"]["by_job"]  # it serves forever: the trainer's completion ended it
    parts = {p["name"]: p for p in run_state(paths).parts}
    assert (parts["trainer"]["state"], parts["rollout"]["state"]) == ("COMPLETED", "ENDED")
    assert parts["rollout"]["ranks"] == 2
    assert job.result()["returncode"] == 0


def test_the_profiles_signal_stops_every_part_once_and_a_cancelled_run_resubmits(local_profile: Path) -> None:
    paths, run_id, job_id = submit(local_profile, "components.trainer.command=python rl_loop.py trainer "
                                                  "--steps 400 --step-time 0.1")
    wait_until(lambda: len(steps_of(paths, [job_id])) >= 5, 180, "the trainer's step 5", poll_s=0.2)
    os.kill(int(job_id), signal.SIGUSR2)  # the run's job: its supervisor sends it on to every part
    wait_until(lambda: len(events(paths, "launch")) >= 4, 180, "both parts launched again", poll_s=0.2)
    (restart,) = RunFile(paths).read().restarts  # one decision for the run, by the trainer's rank 0
    assert (restart.kind, restart.cause, restart.job_id) == ("requeue", "preemption", job_id)
    assert restart.step is not None and restart.step >= 5
    wait_until(lambda: "trainer resumed" in trainer_log(paths, job_id), 180, "the trainer resumed", poll_s=0.2)
    assert re.search(rf"^trainer resumed at step={restart.step}$", trainer_log(paths, job_id), re.M)
    launched = events(paths, "launch")
    assert sorted((str(e["part"]), e["incarnation"]) for e in launched) == [
        ("rollout", 0), ("rollout", 1), ("trainer", 0), ("trainer", 1)]

    # A cancel ends every process of the run (the supervisor, both parts' ranks, the commands they run).
    assert runner.invoke(app, ["cancel", run_id, "-p", str(local_profile)]).exit_code == 0
    assert not procs.group_alive(int(job_id))
    assert run_state(paths).state == "FAILED"
    result = runner.invoke(app, ["resubmit", run_id, "-p", str(local_profile), "--json"])
    assert result.exit_code == 0, result.output
    second = json.loads(result.stdout)["job_id"]
    assert second != job_id and paths.part("rollout").job_folder.joinpath(f"{second}_submitted.pkl").exists()
    wait_until(lambda: len(steps_of(paths, [second])) >= 1, 180, "the resubmitted trainer's first step", poll_s=0.2)
    resumed = int(re.findall(r"^trainer resumed at step=(\d+)$", trainer_log(paths, second), re.M)[-1])
    assert resumed >= restart.step and steps_of(paths, [second])[0] == resumed + 1
    assert runner.invoke(app, ["cancel", run_id, "-p", str(local_profile)]).exit_code == 0
    assert not procs.group_alive(int(second))


def test_a_local_part_that_fails_ends_the_run(local_profile: Path, tmp_path: Path) -> None:
    paths, run_id, job_id = submit(
        local_profile, f"components.rollout.command=python rl_loop.py rollout --crash-once {tmp_path / 'crashed'}",
        "components.trainer.command=python rl_loop.py trainer --steps 400 --step-time 0.1")
    assert slurmkit.Job.from_id(run_id, profile=str(local_profile)).wait(timeout=300) == "FAILED"
    assert (tmp_path / "crashed").exists()
    ended = {str(e["part"]): e for e in events(paths, "part_ended")}
    assert ended["rollout"]["exit_code"] != 0 and not ended["rollout"]["by_job"] and ended["trainer"]["by_job"]
    parts = {p["name"]: p["state"] for p in run_state(paths).parts}
    assert parts == {"trainer": "ENDED", "rollout": "FAILED"}
    assert len(steps_of(paths, [job_id])) < 400  # ended by the run, not run to its end
    assert not procs.group_alive(int(job_id))


def test_a_sweep_of_a_heterogeneous_spec_runs_each_task_as_its_own_local_heterogeneous_run(
        local_profile: Path, tmp_path: Path) -> None:
    spec = tmp_path / "rlsweep.yaml"
    spec.write_text((EXAMPLES / "rl.yaml").read_text().replace(
        "python rl_loop.py trainer --steps 40", f"python {EXAMPLES / 'rl_loop.py'} trainer --steps $STEPS")
        .replace("python rl_loop.py rollout", f"python {EXAMPLES / 'rl_loop.py'} rollout")
        + 'sweep:\n  grid: {env.STEPS: ["3", "6"]}\n')
    result = runner.invoke(app, ["sweep", "submit", str(spec), "-p", str(local_profile), "--json"])
    assert result.exit_code == 0, result.output
    sweep = SweepPaths(Path(json.loads(result.stdout)["sweep_dir"]))
    wait_until(lambda: [s.state for s in results.task_states(sweep)] == ["COMPLETED"] * 2, 300,
               "both tasks completed", poll_s=0.5)
    for index, steps in ((0, 3), (1, 6)):
        task = sweep.task(index)
        record = RunFile(task).read()
        assert record.sweep is not None and record.sweep.index == index
        (job_id,) = record.job_ids
        assert steps_of(task, [job_id]) == list(range(1, steps + 1))  # its own STEPS, sampled from its rollout
        parts = {p["name"]: p["state"] for p in run_state(task).parts}
        assert parts == {"trainer": "COMPLETED", "rollout": "ENDED"}
        assert RunFile(task.part("rollout")).read().job_ids == [] and task.part("rollout").job_folder.joinpath(
            f"{job_id}_submitted.pkl").exists()
