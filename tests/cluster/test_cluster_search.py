"""Search sweeps on the real dev cluster: TPE finds a known optimum in ceil(trials / batch) job
arrays, a driver killed mid-study resumes with no trial lost or run twice, and the pruner stops a
trial whose curve is clearly worse, at a step boundary, for good."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from slurmkit.cli.app import app
from slurmkit.common.metrics import read_records
from slurmkit.common.record import RunFile
from slurmkit.common.sweep_layout import ArrayEntry, ArrayLog, DriverFile, Manifest, SweepManifest, SweepPaths
from slurmkit.sweeps import arrays, results, search, search_view, study
from tests.cluster.test_cluster_sweeps import KILLED_AFTER_SBATCH
from tests.conftest import wait_until

pytestmark = pytest.mark.cluster
runner = CliRunner()
OPTIMUM = 0.3
TOLERANCE = 0.1  # |x - optimum| of the best trial; TPE (seed 0, 20 trials, batches of 5) lands within 0.05
# A trial's objective: one command, no torch; the value is logged as a command's own metrics are.
OBJECTIVE = ("import os, slurmkit.tracking as t\n"
             "x = float(os.environ['X'])\n"
             f"t.log({{'loss': (x - {OPTIMUM}) ** 2}}, step=1)\n")
CURVE_STEPS = 30
# A learning curve: loss = X + 1/step, one step every 0.3 s; a larger X is a worse curve all along.
CURVE = ("import os, time, slurmkit.tracking as t\n"
         "x = float(os.environ['X'])\n"
         f"for step in range(1, {CURVE_STEPS + 1}):\n"
         "    t.log({'loss': x + 1.0 / step}, step=step)\n"
         "    time.sleep(0.3)\n")


def search_spec(tmp_path: Path, script: str, sweep: dict[str, Any]) -> Path:
    (tmp_path / "trial.py").write_text(script)
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump({"name": "srch", "command": f"python -P {tmp_path / 'trial.py'}",
                                    "resources": {"time": "00:05:00"}, "sweep": sweep}))
    return path


def submitted(path: Path, profile: Path) -> SweepPaths:
    result = runner.invoke(app, ["sweep", str(path), "-p", str(profile), "--json"])
    assert result.exit_code == 0, result.output
    return SweepPaths(Path(json.loads(result.stdout)["sweep_dir"]))


def ran_once(paths: SweepPaths, index: int) -> bool:
    return len(RunFile(paths.task(index)).read().job_ids) == 1


def all_queued(manifest: SweepManifest, n: int) -> bool:
    """The first n trials are tasks, each in an array sbatch answered (a kill inside sbatch has its
    own test below)."""
    return len(manifest.tasks) >= n and not search.never_submitted(manifest) and all(
        a.job_id for a in manifest.arrays)


def ended(paths: SweepPaths, indices: range) -> bool:
    return all(not results.is_active(s.state) for s in results.task_states(paths) if s.index in indices)


def test_tpe_finds_the_optimum_in_one_array_a_batch_and_a_killed_driver_loses_no_trial(
        cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    trials, batch = 20, 5
    path = search_spec(tmp_path, OBJECTIVE, {"search": {
        "sampler": "tpe", "trials": trials, "batch": batch, "metric": "loss", "mode": "min", "seed": 0,
        "params": {"env.X": {"uniform": [-2.0, 2.0]}}}, "max_parallel": 4})
    paths = submitted(path, dev_profile)
    assert "#SBATCH --array=0-4%4" in paths.script(0).read_text()

    wait_until(lambda: all_queued(Manifest(paths).read(), 2 * batch), 300, "the driver submitted its second batch")
    os.kill(DriverFile(paths).read().pid or 0, signal.SIGKILL)  # the login node rebooting, to the driver
    wait_until(lambda: search_view.search_state(paths).driver == "dead", 30, "the driver seen dead")
    wait_until(lambda: ended(paths, range(batch, 2 * batch)), 300, "the second batch ended without a driver")
    assert len(Manifest(paths).read().tasks) == 2 * batch, "no driver, no new batch"

    resumed = runner.invoke(app, ["sweep", "resume", paths.sweep_id, "-p", str(dev_profile)])
    assert resumed.exit_code == 0, resumed.output
    assert search_view.resume(paths) is None, "one driver at a time"
    state = search_view.follow(paths, timeout_s=600)
    assert state.driver == "done"
    assert [t.state for t in state.trials] == [study.COMPLETE] * trials
    arrays = [a for a in ArrayLog(paths).read().arrays if a.job_id]
    assert len(arrays) == math.ceil(trials / batch)
    assert [a.indices for a in arrays] == [list(range(k, k + batch)) for k in range(0, trials, batch)]
    assert all(ran_once(paths, i) for i in range(trials))
    assert state.best is not None and abs(float(state.best.params["env.X"]) - OPTIMUM) <= TOLERANCE
    table = results.results(paths)
    assert table.sort == "loss" and table.rows[0]["index"] == state.best.number


def test_the_pruner_stops_a_clearly_worse_trial_at_a_step_boundary_for_good(
        cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    # Seed 3 draws X 0.551, 0.708 (batch 1), then 0.222 and 0.871: the last is worse than the
    # median of the two completed curves at every step, the third better.
    path = search_spec(tmp_path, CURVE, {"search": {
        "sampler": "random", "trials": 4, "batch": 2, "metric": "loss", "seed": 3,
        "params": {"env.X": {"uniform": [0.0, 1.0]}}},
        "prune": {"pruner": "median", "warmup_steps": 3, "startup_trials": 2, "check_s": 1}})
    paths = submitted(path, dev_profile)
    state = search_view.follow(paths, timeout_s=600)
    assert state.driver == "done"
    xs = [float(t.params["env.X"]) for t in state.trials]
    median = (xs[0] + xs[1]) / 2
    worse = [t.number for t in state.trials[2:] if float(t.params["env.X"]) > median]
    assert worse, "the seed draws a worse curve in the second batch"
    assert [t.number for t in state.trials if t.state == study.PRUNED] == worse
    statuses = {s.index: s for s in results.task_states(paths)}
    for n in range(4):
        steps = [r["step"] for r in read_records(paths.task(n).logged)]
        record = RunFile(paths.task(n)).read()
        if n in worse:
            assert statuses[n].state == results.PRUNED
            assert max(steps) < CURVE_STEPS, "it ended early"
            assert record.restarts == [] and statuses[n].restarts == 0, "not requeued"
            assert record.final is not None
        else:
            assert statuses[n].state == "COMPLETED" and max(steps) == CURVE_STEPS
    assert set(DriverFile(paths).read().pruned) == {str(n) for n in worse}


# The submitter of one array, killed once sbatch has answered, before the job id is written.
SUBMIT_TASKS_KILLED_AFTER_SBATCH = KILLED_AFTER_SBATCH + """
from pathlib import Path
from slurmkit.common.sweep_layout import Manifest, SweepPaths
from slurmkit.sweeps import search
paths = SweepPaths(Path(sys.argv[1]))
search.submit_tasks(paths, Manifest(paths).read(), [int(sys.argv[2])])
"""


def test_arrays_of_a_driver_killed_inside_sbatch_are_adopted_or_submitted_again(
        cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    trials = 4
    path = search_spec(tmp_path, OBJECTIVE, {"search": {
        "sampler": "random", "trials": trials, "batch": 2, "metric": "loss", "mode": "min", "seed": 0,
        "params": {"env.X": {"uniform": [-2.0, 2.0]}}}})
    paths = submitted(path, dev_profile)
    os.kill(DriverFile(paths).read().pid or 0, signal.SIGKILL)
    wait_until(lambda: search_view.search_state(paths).driver == "dead", 30, "the driver seen dead")
    manifest = Manifest(paths).read()
    assert manifest.search is not None
    opened = study.open_study(paths, manifest.search, None)

    # Trial 2: its entry names a script sbatch never saw, whose sbatch may answer until its timeout.
    opened.ask(study.distributions(manifest.search))
    search.adopt_asked(paths, manifest, opened)
    with ArrayLog(paths).editing() as log:
        log.arrays.append(ArrayEntry(kind="initial", indices=[2], base=2, array="0", submission=".never-sent.sh",
                                     sbatch_at=time.time(), created=dt.datetime.now().isoformat(timespec="seconds")))
        unqueued = len(log.arrays) - 1
    clock, slept = [time.time()], []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    assert arrays.recover(paths, lambda ix: search.submit_tasks(paths, Manifest(paths).read(), ix), sleep,
                          lambda: clock[0]) == []
    assert sum(slept) >= arrays.LOST_AFTER_S - 1, "it waited out that sbatch's timeout before submitting again"
    log = ArrayLog(paths).read()
    assert log.arrays[unqueued].error == arrays.NEVER_QUEUED and log.arrays[unqueued].job_id is None
    assert log.arrays[-1].indices == [2] and log.arrays[-1].job_id

    # Trial 3: its submitter killed after sbatch queued it, before the job id was written.
    opened.ask(study.distributions(manifest.search))
    search.adopt_asked(paths, Manifest(paths).read(), opened)
    child = subprocess.run([sys.executable, "-P", "-c", SUBMIT_TASKS_KILLED_AFTER_SBATCH, str(paths.sweep_dir),
                            "3"], check=False)
    assert child.returncode == -signal.SIGKILL
    lost = ArrayLog(paths).read().arrays[-1]
    assert lost.indices == [3] and lost.job_id is None and lost.submission

    resumed = runner.invoke(app, ["sweep", "resume", paths.sweep_id, "-p", str(dev_profile)])
    assert resumed.exit_code == 0, resumed.output
    state = search_view.follow(paths, timeout_s=300)
    assert state.driver == "done"
    assert [t.state for t in state.trials] == [study.COMPLETE] * trials
    log = ArrayLog(paths).read()
    assert log.arrays[-1].indices == [3] and log.arrays[-1].job_id, "the queued array adopted, not sent again"
    assert sorted(i for a in log.arrays if a.job_id for i in a.indices) == list(range(trials))
    assert all(ran_once(paths, i) for i in range(trials))
