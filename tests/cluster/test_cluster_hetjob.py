"""A heterogeneous run on the dev cluster (docs/heterogeneous.md): a trainer on node1 beside two
rollout workers on node2, one Slurm heterogeneous job, talking over TCP through
SLURMKIT_ROLLOUT_HOST. One run serves the four cases: the parts talk, a part crashes (the rollout
restarts alone in the job), a preemption stops both parts and requeues the job once, and sacct
shows the job's two components. examples/rl_loop.py is the user's code (docs/heterogeneous.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RunFile
from slurmkit.common.sweep_layout import SweepPaths
from slurmkit.insight import report
from slurmkit.load.loader import resolve
from slurmkit.runs import jobs, lookup
from slurmkit.sweeps import results
from slurmkit.sweeps import spec as sweeps_spec
from slurmkit.sweeps import submit as sweeps_submit
from tests.conftest import EXAMPLES, ROOT, steady, supervisor_events, wait_until, write_dev_profile

pytestmark = pytest.mark.cluster
TOY = EXAMPLES / "rl_loop.py"
STEPS = 30


@dataclass(frozen=True)
class Run:
    paths: RunPaths
    job_id: str
    trainer: list[str]
    """The trainer's (rank 0 of the primary part) output lines, every incarnation's."""


def trainer_lines(paths: RunPaths, job_id: str) -> list[str]:
    log = paths.rank_log(job_id, 0)
    return log.read_text().splitlines() if log.exists() else []


@pytest.fixture(scope="module")
def run(cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Run:
    tmp = tmp_path_factory.mktemp("het")
    profile = write_dev_profile(tmp / "dev.yaml", tmp / "runs")
    crashed = tmp / "crashed-once"
    spec = {"name": "rl", "resources": {"time": "00:10:00"},
            "components": {
                "trainer": {"command": f"python {TOY} trainer --steps {STEPS} --step-time 0.1",
                            "resources": {"nodes": 1, "tasks_per_node": 1}},
                "rollout": {"command": f"python {TOY} rollout --crash-once {crashed}",
                            "resources": {"nodes": 1, "tasks_per_node": 2}}}}
    sub = jobs.submit(resolve(spec, str(profile)))
    assert sub.job_id
    paths = RunPaths(Path(sub.run_dir))
    # The rollout's restarted workers have answered the trainer: preempt the job now.
    wait_until(lambda: any("attempt=1" in ln for ln in trainer_lines(paths, sub.job_id)), 240,
               "samples from the restarted rollout part", poll_s=0.2)
    subprocess.run(["scancel", "--batch", "--signal=USR2", sub.job_id], check=True)
    st = jobs.wait(paths, poller=steady(0.5), timeout_s=400)
    assert st.state == "COMPLETED", st
    return Run(paths, sub.job_id, trainer_lines(paths, sub.job_id))


def sacct(paths: RunPaths, job_id: str, fields: str) -> list[str]:
    """sacct's allocation lines of the run's job: only jobs since the run was made (a dev cluster
    started with --purge numbers its jobs from 1 again, and its accounting keeps the older ones)."""
    since = RunFile(paths).read().created
    return subprocess.run(["sacct", "-X", "-n", "-P", "-j", job_id, "-S", since, "-o", fields],
                          check=True, capture_output=True, text=True).stdout.splitlines()


def parts_of(events: list[dict[str, Any]], part: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("part") == part]


def test_two_parts_on_two_nodes_talk_over_tcp_each_its_own_world(run: Run) -> None:
    (hello,) = [ln for ln in run.trainer if ln.startswith("trainer rank=") and "on=node1" in ln][:1]
    # The trainer is a world of one on node1; it found the rollout's first node by its variable.
    assert "world=1" in hello and "rollout=node2" in hello and "mine=['trainer']" in hello
    samples = [ln for ln in run.trainer if re.match(r"trainer step=\d+ sample ", ln)]
    assert samples and all("from=node2 world=2" in ln for ln in samples)
    rollout = RunPaths(run.paths.run_dir / "parts" / "rollout")
    ports = {int(m) for r in (0, 1) for m in re.findall(r"rollout rank=\d world=2 port=(\d+)",
                                                        rollout.rank_log(run.job_id, r).read_text())}
    trainer_port = int(re.findall(r" port=(\d+) ", hello)[0])
    assert len(ports) == 1 and trainer_port not in ports  # each part its own rendezvous port
    assert jobs.result(run.paths)["stdout"].strip().endswith(f"trainer done weight={float(STEPS)}")


def test_a_crashed_part_restarts_alone_in_the_job(run: Run) -> None:
    events = [e for e in supervisor_events(run.paths.run_dir, "launch") + supervisor_events(
        run.paths.run_dir, "decision") + supervisor_events(run.paths.run_dir, "part_ended") if e["restart_count"] == 0]
    events.sort(key=lambda e: e["time"])
    rollout = parts_of(events, "rollout")
    assert [(e["event"], e["part_attempt"]) for e in rollout][:3] == [("launch", 0), ("part_ended", 0),
                                                                    ("launch", 1)]
    assert rollout[1]["exit_code"] != 0
    crash = [e for e in events if e["event"] == "decision"][0]
    assert (crash["action"], crash["cause"]) == ("restart_in_job", "crash")
    # The trainer ran on: one launch of it in the first incarnation.
    assert [e["event"] for e in parts_of(events, "trainer")].count("launch") == 1
    restarts = RunFile(run.paths).read().restarts
    assert [(r.kind, r.cause) for r in restarts] == [("in_job", "crash"), ("requeue", "preemption")]
    # The report draws each part's steps: the crashed one ended by itself, the rest by the job's ends.
    spans = [(s.part, s.restart_count, s.attempt, s.by_job) for s in report.collect(run.paths).parts]
    assert ("rollout", 0, 0, False) in spans and ("rollout", 0, 1, True) in spans
    assert ("trainer", 1, 0, False) in spans and ("rollout", 1, 0, True) in spans


def test_a_preemption_stops_every_part_and_requeues_the_job_once(run: Run) -> None:
    stops = [e for e in supervisor_events(run.paths.run_dir, "decision") if e["cause"] == "preemption"]
    assert len(stops) == 1 and stops[0]["action"] == "requeue"
    stopped_at = stops[0]["step"]
    ended = [e for e in supervisor_events(run.paths.run_dir, "part_ended") if e["restart_count"] == 0]
    assert {e["part"] for e in ended} == {"trainer", "rollout"}
    # Both parts ran again in the second incarnation, and the trainer went on from its agreed stop.
    again = [e for e in supervisor_events(run.paths.run_dir, "launch") if e["restart_count"] == 1]
    assert sorted(e["part"] for e in again) == ["rollout", "trainer"]
    assert f"trainer resumed at step={stopped_at}" in run.trainer
    steps = [int(m) for ln in run.trainer for m in re.findall(r"^trainer step=(\d+) ", ln)]
    assert sorted(set(steps)) == list(range(1, STEPS + 1)) and steps.count(stopped_at + 1) == 1


def test_sacct_shows_the_heterogeneous_jobs_components(run: Run) -> None:
    rows = sacct(run.paths, run.job_id, "JobID,NodeList")
    assert {f"{run.job_id}+0|node1", f"{run.job_id}+1|node2"} <= set(rows)
    status = jobs.run_state(run.paths)
    assert status.state == "COMPLETED" and status.nodes == "node1,node2"
    parts = {p["name"]: p for p in status.parts}
    assert parts["trainer"]["state"] == "COMPLETED" and parts["rollout"]["ranks"] == 2


def test_the_python_example_of_the_docs_runs_as_written(cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    """docs/heterogeneous.md's Executor.submit_components example, in a fresh interpreter, on the
    test's own run root: two function parts, the trainer's return the run's result."""
    text = (ROOT / "docs" / "heterogeneous.md").read_text()
    example = text.split("## From Python", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert 'profile="devcluster"' in example
    (tmp_path / "example.py").write_text(example.replace('profile="devcluster"', f"profile={str(dev_profile)!r}"))
    proc = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "trained 100 steps against the rollout on node2"


def test_cancel_ends_every_component_and_resubmit_starts_every_part_again(cluster: None, tmp_path: Path,
                                                                          dev_profile: Path) -> None:
    mark = tmp_path / "second-time"
    spec = {"name": "rl-cancel", "resources": {"time": "00:05:00"}, "components": {
        "trainer": {"command": f"if [ -e {mark} ]; then echo trainer again; else touch {mark}; sleep 300; fi"},
        "rollout": {"command": 'echo "rollout up as $SLURMKIT_COMPONENT"; sleep 300'}}}
    sub = jobs.submit(resolve(spec, str(dev_profile)))
    assert sub.job_id
    paths = RunPaths(Path(sub.run_dir))
    rollout = paths.part("rollout")
    wait_until(lambda: mark.exists() and rollout.rank_log(sub.job_id, 0).exists()
               and "rollout up as rollout" in rollout.rank_log(sub.job_id, 0).read_text(), 120, "both parts up")
    jobs.cancel(paths)
    assert jobs.wait(paths, poller=steady(0.5), timeout_s=120).state == "CANCELLED"
    # Accounting lists the cancelled job as JOB alone at first, then as its components.
    cancelled = {f"{sub.job_id}+0": "CANCELLED", f"{sub.job_id}+1": "CANCELLED"}
    wait_until(lambda: {r.split("|")[0]: r.split("|")[1].split()[0]  # "CANCELLED by 0": the state
                        for r in sacct(paths, sub.job_id, "JobID,State")} == cancelled, 60,
               "sacct's two cancelled components", poll_s=1.0)
    again = jobs.resubmit(paths)
    assert again.job_id and again.job_id != sub.job_id
    assert jobs.wait(paths, poller=steady(0.5), timeout_s=180).state == "COMPLETED"
    # The rollout part's call was copied under the new job id too: it started again.
    assert "rollout up as rollout" in rollout.rank_log(again.job_id, 0).read_text()
    assert "trainer again" in paths.rank_log(again.job_id, 0).read_text()


def test_a_sweep_over_a_heterogeneous_spec_is_one_heterogeneous_job_a_task(cluster: None, tmp_path: Path,
                                                                          run_root: Path) -> None:
    """Each task its own heterogeneous job (Slurm runs none as an array task), max_parallel a window of
    dependencies; a failed task resubmitted (--failed) runs again and completes. No in-job restart or
    requeue for the failing part: its failure ends its task at once."""
    profile = write_dev_profile(tmp_path / "dev.yaml", run_root, requeue={"standby": False, "in_job": 0, "crash": 0})
    fixed = tmp_path / "fixed"
    spec_file = tmp_path / "rlsweep.yaml"
    spec_file.write_text(yaml.safe_dump({
        "name": "rlsw", "resources": {"time": "00:05:00"}, "result": "trainer",  # safe_dump sorts the parts
        "components": {
            "trainer": {"command": f'[ "$X" = a ] || [ -e {fixed} ] || exit 3; echo "trainer $X seed $SLURMKIT_SEED"'},
            "rollout": {"command": 'echo "rollout $X up as $SLURMKIT_COMPONENT"; sleep 300'}},
        "sweep": {"grid": {"env.X": ["a", "b"]}, "max_parallel": 1}}))
    done = sweeps_submit.submit(sweeps_spec.load(spec_file), str(profile))
    assert done.tasks == 2 and len(done.array_job_ids) == 2  # two sbatches: one heterogeneous job each
    paths = SweepPaths(Path(done.sweep_dir))
    first, second = done.array_job_ids
    # max_parallel 1: task 1 waits for task 0's job.
    assert f"#SBATCH --dependency=afterany:{first}" in (paths.task(1).run_dir / "sbatch.sh").read_text()
    states = wait_until_final(paths)
    assert [(s.state, s.job_id) for s in states] == [("COMPLETED", first), ("FAILED", second)]
    task0 = paths.task(0)
    assert re.search(r"^trainer a seed \d+$", task0.rank_log(first, 0).read_text(), re.M)
    assert "rollout a up as rollout" in task0.part("rollout").rank_log(first, 0).read_text()
    assert {f"{first}+0", f"{first}+1"} <= {r.split("|")[0] for r in sacct(task0, first, "JobID")}
    record = RunFile(task0).read()
    assert record.sweep is not None and (record.sweep.sweep_id, record.sweep.index) == (paths.sweep_id, 0)
    assert lookup.find(str(run_root), first) == task0  # `slurmkit logs JOB` finds the task by its job id

    fixed.touch()
    assert sweeps_submit.resubmit_failed(paths, {s.index: s.state for s in states}) == [1]
    states = wait_until_final(paths)
    third = states[1].job_id
    assert [s.state for s in states] == ["COMPLETED", "COMPLETED"] and third not in (first, second)
    assert "trainer b seed" in paths.task(1).rank_log(third, 0).read_text()
    assert RunFile(paths.task(1)).read().job_ids == [second, third]


def wait_until_final(paths: SweepPaths) -> list[results.TaskState]:
    found: list[results.TaskState] = []

    def final() -> bool:
        found[:] = results.task_states(paths)
        return all(s.state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") for s in found)

    wait_until(final, 300, "every task ended", poll_s=0.5)
    return found
