"""The local profile rehearses what a cluster does (issue 51, item 5): the profile's signal sent to a
local run goes through the same agreed stop, and the run starts again as a new local incarnation
with its restart recorded, resuming from the step saved: preemption tried on a laptop."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import yaml
from typer.testing import CliRunner

import slurmkit
from slurmkit.cli.app import app
from slurmkit.common.layout import RunPaths
from slurmkit.common.metrics import read_records
from slurmkit.common.record import RunFile
from tests.conftest import wait_until

runner = CliRunner()


def ranks(controller: str) -> list[int]:
    """The local job's rank processes: its controller's children (the job id is the controller's pid)."""
    children = Path(f"/proc/{controller}/task/{controller}/children")
    return [int(p) for p in children.read_text().split()] if children.exists() else []


def signal_ranks(controller: str) -> None:
    for pid in ranks(controller):
        os.kill(pid, signal.SIGUSR2)  # the profile's signal, as the local controller sends it at the limit


def test_a_signalled_local_training_run_stops_saves_and_starts_again_with_the_restart_recorded(
        tmp_path: Path, local_profile: Path) -> None:
    spec = tmp_path / "digits.yaml"
    spec.write_text(yaml.safe_dump({"name": "digits", "task": "train", "resources": {"tasks_per_node": 2},
                                    "config": {"model": "digits", "steps": 400, "batch_size": 32, "log_every": 1,
                                               "checkpoint_every": 1000}}))
    result = runner.invoke(app, ["submit", str(spec), "-p", str(local_profile), "--json"])
    assert result.exit_code == 0, result.output
    sub = json.loads(result.stdout)
    paths = RunPaths(Path(sub["run_dir"]))
    wait_until(lambda: len(read_records(paths.metrics)) >= 20, 180, "step 20", poll_s=0.2)
    signal_ranks(sub["job_id"])
    job = slurmkit.Job.from_id(sub["run_id"], profile=str(local_profile))
    assert job.wait(timeout=300) == "COMPLETED"
    record = RunFile(paths).read()
    (restart,) = record.restarts
    assert (restart.kind, restart.cause, restart.n, restart.job_id) == ("requeue", "preemption", 1, sub["job_id"])
    assert restart.step is not None and 20 <= restart.step < 400
    steps = [r["step"] for r in read_records(paths.metrics)]
    # The stop saved its step (checkpoint_every alone would never have): the second incarnation goes on
    # from it, so no step ran twice.
    assert steps == list(range(1, 401)) and job.result()["steps"] == 400


def test_a_submitit_checkpointable_signalled_locally_goes_on_where_checkpoint_left_it(local_profile: Path) -> None:
    """submitit's Checkpointable pattern (tests/cluster/test_cluster_python_api.Counter) on the local profile:
    the signal asks checkpoint() for the next call, and the next local incarnation runs it."""
    from tests.cluster.test_cluster_python_api import Counter

    job = slurmkit.Executor(profile=str(local_profile), name="counter", tasks_per_node=1).submit(Counter(), 40)
    log = Path(job.run_dir) / "count.log"
    wait_until(lambda: log.exists() and len(log.read_text().splitlines()) >= 8, 120, "count 8", poll_s=0.2)
    signal_ranks(job.job_id)
    done, starts = job.result(timeout=300)
    assert done == 40 and len(starts) == 2 and starts[0] == 0 and starts[1] >= 8
    assert [(r.kind, r.cause) for r in RunFile(job.paths).read().restarts] == [("requeue", "preemption")]


def test_a_cancelled_local_run_is_resubmitted_and_resumes_from_its_last_save(
        tmp_path: Path, local_profile: Path) -> None:
    """`slurmkit resubmit` of a local run, as of a Slurm one: a new job (a new controller) on the
    run's own call, recorded as a resubmit, resuming from the newest committed checkpoint."""
    spec = tmp_path / "digits.yaml"
    spec.write_text(yaml.safe_dump({"name": "digits", "task": "train", "resources": {"tasks_per_node": 1},
                                    # 1,000 steps: a loaded machine's slow poll still sees step 120 long before the end.
                                    "config": {"model": "digits", "steps": 1000, "batch_size": 32, "log_every": 1,
                                               "checkpoint_every": 50, "async_save": False}}))
    result = runner.invoke(app, ["submit", str(spec), "-p", str(local_profile), "--json"])
    assert result.exit_code == 0, result.output
    first = json.loads(result.stdout)
    paths = RunPaths(Path(first["run_dir"]))
    wait_until(lambda: len(read_records(paths.metrics)) >= 120, 180, "step 120", poll_s=0.2)
    assert runner.invoke(app, ["cancel", first["run_id"], "-p", str(local_profile)]).exit_code == 0
    job = slurmkit.Job.from_id(first["run_id"], profile=str(local_profile))
    assert job.wait(timeout=120) != "COMPLETED"
    result = runner.invoke(app, ["resubmit", first["run_id"], "-p", str(local_profile), "--json"])
    assert result.exit_code == 0, result.output
    second = json.loads(result.stdout)["job_id"]
    assert second != first["job_id"] and RunFile(paths).read().job_ids == [first["job_id"], second]
    assert slurmkit.Job.from_id(first["run_id"], profile=str(local_profile)).wait(timeout=300) == "COMPLETED"
    assert [(r.kind, r.job_id) for r in RunFile(paths).read().restarts] == [("resubmit", second)]
    records = read_records(paths.metrics)
    steps = [r["step"] for r in records]
    # Each process's first record carries its start-up: the second job's first record is the second
    # such. (Its step need not go back: a cancel just after step 150's save resumes at 151.)
    back = [i for i, r in enumerate(records) if "startup" in r][1]
    assert steps[-1] == 1000 and (steps[back] - 1) % 50 == 0  # it went on from a committed step (a multiple of 50)
    assert steps[back - 1] >= max(120, steps[back] - 1) and steps[back:] == list(range(steps[back], 1001))
