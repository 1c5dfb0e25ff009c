"""Sweeps as job arrays on the real dev cluster: throttling, resubmitting failures, splitting, chaining."""

from __future__ import annotations

import json
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
from slurmkit.common import sweep_layout
from slurmkit.slurm import commands
from slurmkit.sweeps import results, spec
from slurmkit.sweeps import submit as sub
from tests.conftest import EXAMPLES, steady, wait_until

pytestmark = pytest.mark.cluster
runner = CliRunner()
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def write_sweep(tmp_path: Path, sweep: dict[str, Any], command: str = "sleep 3") -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "csw", "command": command, "resources": {"time": "00:05:00"},
                                    "sweep": sweep}))
    return path


def invoke(*args: str) -> dict[str, Any]:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def sbatch_calls_during(fn: Any) -> tuple[Any, int]:
    with commands.counting() as calls:
        value = fn()
    return value, calls["sbatch"]


def wait_sweep(paths: sweep_layout.SweepPaths, timeout_s: float = 240) -> list[results.TaskState]:
    deadline = time.monotonic() + timeout_s
    while True:
        states = results.task_states(paths)
        if all(s.state in FINAL for s in states):
            return states
        assert time.monotonic() < deadline, f"sweep still running: {results.counts(states)}"
        time.sleep(0.3)


def test_grid_of_six_is_one_array_throttled_to_two_then_a_job_runs_after_it(
        cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    path = write_sweep(tmp_path, {"grid": {"env.LR": ["0.1", "0.03", "0.01"], "env.WD": ["0", "0.1"]}})
    done, sbatches = sbatch_calls_during(lambda: invoke("sweep", str(path), "-p", str(dev_profile),
                                                        "--max-parallel", "2"))
    assert done["tasks"] == 6 and len(done["array_job_ids"]) == 1
    assert sbatches == 1
    paths = sweep_layout.SweepPaths(Path(done["sweep_dir"]))
    assert "#SBATCH --array=0-5%2" in paths.script(0).read_text()

    after = invoke("submit", str(EXAMPLES / "hostnames.yaml"), "-p", str(dev_profile), "--after", paths.sweep_id)
    script = (Path(after["run_dir"]) / "sbatch.sh").read_text()
    assert f"#SBATCH --dependency=afterok:{done['array_job_ids'][0]}" in script

    states = wait_sweep(paths)
    assert [s.state for s in states] == ["COMPLETED"] * 6

    with commands.counting() as calls:
        rows = runner.invoke(app, ["sweep", "results", paths.sweep_id, "-p", str(dev_profile), "--json"])
    assert calls["squeue"] == 1 and calls["sacct"] <= 1 and calls.total() <= 2
    table = json.loads(rows.output)
    assert len(table) == 6
    assert {(r["env.LR"], r["env.WD"]) for r in table} == {(a, b) for a in ("0.1", "0.03", "0.01")
                                                          for b in ("0", "0.1")}
    assert all(r["returncode"] == 0 for r in table)

    from slurmkit.common.layout import RunPaths
    from slurmkit.runs import jobs

    final = jobs.wait(RunPaths(Path(after["run_dir"])), poller=steady(0.5), timeout_s=120)
    assert final.state == "COMPLETED"
    ids = [f"{done['array_job_ids'][0]}_{i}" for i in range(6)] + [after["job_id"]]
    times: dict[str, list[str]] = {}

    def accounted() -> bool:  # slurmdbd records a job's end a moment after squeue drops it
        out = commands.run(["sacct", "--noheader", "--parsable2", "--allocations", "--jobs", ",".join(ids),
                            "--format=JobID,Start,End"])
        times.update((line.split("|")[0], line.split("|")[1:]) for line in out.splitlines() if line)
        return all(i in times and times[i][1] not in ("", "Unknown") for i in ids)

    wait_until(accounted, 30, "accounting to record every job", poll_s=0.5)
    last_end = max(times[i][1] for i in ids[:-1])
    assert times[after["job_id"]][0] >= last_end, "the dependent job started before the sweep ended"
    # The %2 throttle, from accounting's start and end times (not by sampling squeue): at most two
    # tasks ever overlapped, and two did.
    # (time, -1) sorts before (time, +1): a task ending in the second another starts did not overlap it.
    edges = sorted((t, +1 if k == 0 else -1) for i in ids[:-1] for k, t in enumerate(times[i]))
    running, peak = 0, 0
    for _, delta in edges:
        running += delta
        peak = max(peak, running)
    assert peak == 2, f"{peak} tasks overlapped under --max-parallel 2: {[times[i] for i in ids[:-1]]}"


def test_a_failed_config_is_resubmitted_alone_and_the_sweep_completes(
        cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    command = 'if [ "$MODE" = flaky ] && [ ! -e "$SLURMKIT_RUN_DIR/fixed" ]; then exit 3; fi'
    path = write_sweep(tmp_path, {"grid": {"env.MODE": ["ok", "flaky", "fine"]}}, command)
    # No automatic requeue of the crash: the user fixes the cause, then resubmits.
    done = invoke("sweep", str(path), "-p", str(dev_profile), "--set", "profile.requeue.crash=0", "--wait")
    assert done["counts"] == {"COMPLETED": 2, "FAILED": 1}  # --wait returned once no task was active
    paths = sweep_layout.SweepPaths(Path(done["sweep_dir"]))
    assert [s.state for s in wait_sweep(paths)] == ["COMPLETED", "FAILED", "COMPLETED"]

    (paths.task(1).run_dir / "fixed").write_text("")
    again, sbatches = sbatch_calls_during(
        lambda: invoke("sweep", "resubmit", paths.sweep_id, "--failed", "-p", str(dev_profile)))
    assert again["resubmitted"] == [1] and sbatches == 1
    manifest = sweep_layout.Manifest(paths).read()
    assert [(a.kind, a.indices, a.array) for a in manifest.arrays] == [
        ("initial", [0, 1, 2], "0-2"), ("resubmit", [1], "1")]
    states = wait_sweep(paths)
    assert [s.state for s in states] == ["COMPLETED"] * 3
    first = manifest.arrays[0].job_id
    assert [s.job_id for s in states] == [f"{first}_0", f"{manifest.arrays[1].job_id}_1", f"{first}_2"]
    assert results.counts(states) == {"COMPLETED": 3}
    # What it cost: each task's newest job, sacct's own elapsed seconds times nodes, summed over the sweep.
    node_s: dict[str, int] = {}

    def accounted() -> bool:  # slurmdbd records an end a moment after squeue shows it
        rows = subprocess.run(["sacct", "-X", "-n", "-P", "-j", ",".join(s.job_id for s in states), "-o",
                               "JobID,State,ElapsedRaw,NNodes"], check=True, capture_output=True, text=True).stdout
        node_s.clear()
        node_s.update({j: int(e) * int(n) for j, st, e, n in (row.split("|") for row in rows.split())
                       if st == "COMPLETED"})
        return all(s.job_id in node_s for s in states)

    wait_until(accounted, 60, "sacct to record every task's end", poll_s=0.5)
    states = results.task_states(paths)
    assert [s.node_hours for s in states] == [pytest.approx(node_s[s.job_id] / 3600, abs=1e-4) for s in states]
    shown = invoke("sweep", "status", paths.sweep_id, "-p", str(dev_profile))
    assert shown["cost"]["node_hours"] == pytest.approx(sum(node_s.values()) / 3600, abs=1e-3)
    assert shown["cost"]["gpu_hours"] == 0


def test_a_sweep_over_the_array_limit_is_split_into_chained_arrays(
        cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    plan = spec.load(write_sweep(tmp_path, {"grid": {"env.X": [str(i) for i in range(6)]}, "max_parallel": 2},
                                 "sleep 1"))
    done, sbatches = sbatch_calls_during(lambda: sub.submit(plan, str(dev_profile), max_array_size=4))
    assert sbatches == 2 and len(done.array_job_ids) == 2
    paths = sweep_layout.SweepPaths(Path(done.sweep_dir))
    manifest = sweep_layout.Manifest(paths).read()
    assert [(a.indices, a.base, a.array) for a in manifest.arrays] == [
        ([0, 1, 2, 3], 0, "0-3%2"), ([4, 5], 4, "0-1%2")]
    # Each chunk waits for the previous one, so %2 holds across the whole sweep.
    assert f"#SBATCH --dependency=afterany:{done.array_job_ids[0]}" in paths.script(1).read_text()
    states = wait_sweep(paths)
    assert [s.state for s in states] == ["COMPLETED"] * 6
    assert states[5].job_id == f"{done.array_job_ids[1]}_1"
    # Each task folder is an ordinary run: `slurmkit result/logs <folder>` work on it.
    from slurmkit.runs import jobs

    assert jobs.result(paths.task(5))["returncode"] == 0
    assert jobs.run_state(paths.task(5)).state == "COMPLETED"
    assert {json.loads(paths.task(i).record.read_text())["sweep"]["overrides"]["env.X"] for i in range(6)} == {
        str(i) for i in range(6)}


def test_exactly_max_array_size_tasks_is_one_array_and_one_more_is_two(
        cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    limit = int(commands.show_config()["MaxArraySize"])
    blocker = commands.run(["sbatch", "--parsable", "--hold", "--wrap", "true"]).strip()  # nothing runs
    try:
        for n, arrays in ((limit, 1), (limit + 1, 2)):
            plan = spec.load(write_sweep(tmp_path, {"grid": {"env.A": list(range(n))}}, "true"))
            with commands.counting() as calls:
                done = sub.submit(plan, str(dev_profile), after=f"afterok:{blocker}")
            sbatches = calls["sbatch"]
            paths = sweep_layout.SweepPaths(Path(done.sweep_dir))
            try:
                assert sbatches == arrays == len(done.array_job_ids)
                with commands.counting() as calls:
                    states = results.task_states(paths)
                assert calls["squeue"] == 1 and calls["sacct"] == 0
                # Slurm holds every task, none dropped; none has a folder before it starts.
                assert len(states) == n and {s.state for s in states} == {"PENDING"}
                assert states[-1].job_id == f"{done.array_job_ids[-1]}_{(n - 1) % limit}"
                assert not paths.tasks_dir.exists()
            finally:
                sub.cancel(paths)
    finally:
        commands.scancel([blocker])


def test_a_sweep_larger_than_the_cluster_job_limit_is_refused_before_anything(
        cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    max_jobs = int(commands.show_config()["MaxJobCount"])
    path = write_sweep(tmp_path, {"grid": {"env.A": list(range(max_jobs // 10 + 1)), "env.B": list(range(10))}})
    with commands.counting() as calls:
        result = runner.invoke(app, ["sweep", str(path), "-p", str(dev_profile)])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert f"exceeds the cluster's MaxJobCount={max_jobs}" in result.output
    assert calls["sbatch"] == 0
    assert not list((tmp_path / "runs").iterdir())


def test_digits_sweep_example_trains_every_config(cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    done = invoke("sweep", str(EXAMPLES / "sweep_digits.yaml"), "-p", str(dev_profile), "--set", "config.steps=60")
    paths = sweep_layout.SweepPaths(Path(done["sweep_dir"]))
    assert [s.state for s in wait_sweep(paths, timeout_s=300)] == ["COMPLETED"] * 4
    result = runner.invoke(app, ["sweep", "results", paths.sweep_id, "-p", str(dev_profile), "--sort", "accuracy"])
    assert result.exit_code == 0, result.output
    assert "best: task" in result.output
    rows = json.loads(runner.invoke(app, ["sweep", "results", paths.sweep_id, "-p", str(dev_profile),
                                          "--json"]).output)
    assert [(r["config.lr"], r["config.seed"]) for r in rows] == [(0.003, 0), (0.003, 1), (0.03, 0), (0.03, 1)]
    assert all(r["steps"] == 60 and r["world_size"] == 2 and 0 < r["accuracy"] <= 1 for r in rows)
    # Different seeds give different models; each task kept its own metrics file.
    assert len({r["loss"] for r in rows}) == 4
    assert all(paths.task(i).metrics.exists() for i in range(4))


def test_every_task_of_a_pending_stepped_array_is_pending(cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    """A `sweep resubmit --failed` array of every other task (`--array=1,3,...,39`) is held by Slurm in
    stepped form; squeue prints it `_[1-39:2%2]`, and its expansion leaves a task out on 22.05.
    Every one of them must read PENDING, none UNKNOWN, none dropped."""
    import subprocess

    from slurmkit.sweeps import resolve

    odd = list(range(1, 40, 2))
    plan = spec.load(write_sweep(tmp_path, {"grid": {"env.X": [str(i) for i in range(40)]}}))
    paths = sub.create(plan, resolve.resolve_tasks(plan, str(dev_profile)))
    held = subprocess.run(["sbatch", "--parsable", "--hold", f"--array={','.join(map(str, odd))}%2",
                           "--output=/dev/null", "--wrap", "true"], capture_output=True, text=True,
                          check=True).stdout.strip()
    try:
        with sweep_layout.ArrayLog(paths).editing() as log:
            log.arrays.append(sweep_layout.ArrayEntry(kind="resubmit", indices=odd, base=0, job_id=held))
        compact = subprocess.run(["squeue", "--noheader", "--jobs", held, f"--format={commands.parse.SQUEUE_FORMAT}"],
                                 capture_output=True, text=True, check=True).stdout
        assert f"{held}_[1-39:2%2]" in compact  # Slurm's own stepped form, read back whole
        assert set(commands.parse.squeue(compact)) == {f"{held}_{i}" for i in odd}
        states = {s.index: s.state for s in results.task_states(paths)}
        assert {states[i] for i in odd} == {"PENDING"}, states
        assert {states[i] for i in range(0, 40, 2)} == {"NOT_SUBMITTED"}
    finally:
        commands.scancel([held])


# A child's code runs after this: the child SIGKILLs itself once sbatch has queued an array, before
# the job id is written (submitit parses sbatch's answer there).
KILLED_AFTER_SBATCH = """
import os, signal, sys
from slurmkit.slurm.submitit_executor import RenderedSlurmExecutor

def killed(answer):
    os.kill(os.getpid(), signal.SIGKILL)

RenderedSlurmExecutor._get_job_id_from_submission_command = staticmethod(killed)
"""
SUBMIT_KILLED_AFTER_SBATCH = KILLED_AFTER_SBATCH + """
import runpy
sys.argv = ["slurmkit", *sys.argv[1:]]
runpy.run_module("slurmkit", run_name="__main__")
"""


def test_a_sweep_killed_inside_sbatch_has_its_array_adopted_by_resubmit_not_run_twice(
        cluster: None, tmp_path: Path, dev_profile: Path, run_root: Path) -> None:
    path = write_sweep(tmp_path, {"grid": {"env.MODE": ["a", "b"]}}, "sleep 1")
    child = subprocess.run([sys.executable, "-P", "-c", SUBMIT_KILLED_AFTER_SBATCH, "sweep", str(path), "-p",
                            str(dev_profile)], check=False, capture_output=True, text=True)
    assert child.returncode == -signal.SIGKILL, child.stderr
    (sweep_dir,) = [p.parent for p in run_root.glob("*/sweep.json")]
    paths = sweep_layout.SweepPaths(sweep_dir)
    (lost,) = sweep_layout.ArrayLog(paths).read().arrays
    assert lost.job_id is None and lost.submission
    assert [s.state for s in results.task_states(paths)] == ["NOT_SUBMITTED"] * 2  # what it looks like

    again = invoke("sweep", "resubmit", paths.sweep_id, "--failed", "-p", str(dev_profile))
    assert again["resubmitted"] == []  # Slurm had queued them: adopted, not sent again
    (adopted,) = sweep_layout.ArrayLog(paths).read().arrays
    assert adopted.job_id and adopted.error is None
    states = wait_sweep(paths)
    assert [s.state for s in states] == ["COMPLETED"] * 2
    assert [s.job_id for s in states] == [f"{adopted.job_id}_0", f"{adopted.job_id}_1"]
