"""The Python API on the real dev cluster: functions from __main__ and lambdas, a nested submit,
Job.from_id from a fresh process, JobFailedError's log tail, map_array as one array,
as_completed, a 2-node distributed function, a Checkpoint function preempted and resumed, and
a code snapshot that keeps running the submitted code after the source is edited."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import slurmkit
from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RunFile
from slurmkit.common.sweep_layout import ArrayLog
from slurmkit.runs.folders import list_sweeps
from tests.conftest import wait_until

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[2]


def run_script(tmp_path: Path, body: str, *args: str, cwd: Path | None = None) -> dict[str, Any]:
    """Run `body` as a script's __main__ (so its functions exist only there); its last line is JSON."""
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(body))
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=500,
                          cwd=cwd or tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


MAIN_FUNCTIONS = """
    import json, sys
    import slurmkit

    profile = sys.argv[1]

    def square_then_nested(x):
        # On a compute node: submit from inside the job (a nested pipeline) and wait for it.
        inner = slurmkit.Executor(profile=profile, name="inner").submit(lambda y: y + 1, x * x)
        return {"inner": inner.result(timeout=240), "inner_run": inner.run_id}

    def boom():
        raise ValueError("boom-9931")

    if __name__ == "__main__":
        ex = slurmkit.Executor(profile=profile, name="outer", time="00:05:00")
        outer = ex.submit(square_then_nested, 7)
        lam = ex.submit(lambda: "from-lambda")
        bad = ex.submit(boom)
        out = {"outer": outer.result(timeout=300), "lambda": lam.result(timeout=300), "outer_job": outer.job_id}
        try:
            bad.result(timeout=300)
        except slurmkit.JobFailedError as exc:
            out.update(tail=exc.log_tail, state=bad.state)
        print(json.dumps(out))
"""


def test_main_function_lambda_nested_submit_failure_and_from_id(cluster: None, tmp_path: Path,
                                                                 dev_profile: Path, run_root: Path) -> None:
    out = run_script(tmp_path, MAIN_FUNCTIONS, str(dev_profile))
    assert out["outer"]["inner"] == 50 and out["lambda"] == "from-lambda"
    assert out["state"] == "FAILED" and "boom-9931" in out["tail"] and "ValueError" in out["tail"]
    # The nested run is a run like the others: its own folder and record under the same root.
    inner = RunFile(RunPaths(run_root / out["outer"]["inner_run"])).read()
    assert inner.spec is not None and str(inner.spec.function).endswith("<lambda>") and inner.job_ids
    # A fresh process reattaches by Slurm job id; the CLI's result reads the same run.
    code = (f"import slurmkit, json; j = slurmkit.Job.from_id({out['outer_job']!r}, profile={str(dev_profile)!r}); "
            "print(json.dumps([j.state, j.result()]))")
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert json.loads(again.stdout) == ["COMPLETED", out["outer"]]


def shifted(x: int, y: int) -> int:
    return 100 * x + y


def test_map_array_is_one_array_throttled_and_as_completed(cluster: None, dev_profile: Path, run_root: Path) -> None:
    ex = slurmkit.Executor(profile=str(dev_profile), name="mapped", time="00:05:00")
    handles = ex.map_array(shifted, range(20), range(20, 40), max_parallel=2)
    assert len(handles) == 20 and len({j.job_id.split("_")[0] for j in handles}) == 1
    (sweep,) = list_sweeps(str(run_root))
    arrays = ArrayLog(sweep).read().arrays
    assert len(arrays) == 1 and arrays[0].array == "0-19%2"
    finished = list(slurmkit.as_completed(handles, timeout=600, poll_s=1.0))
    assert sorted(j.run_id for j in finished) == sorted(j.run_id for j in handles)
    assert [j.result() for j in handles] == [100 * i + 20 + i for i in range(20)]
    assert {j.state for j in handles} == {"COMPLETED"}


def allreduce_ranks(base: float) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    rank, world, device = slurmkit.distributed.init()
    t = torch.tensor([base + rank], device=device)
    dist.all_reduce(t)
    return {"rank": rank, "world": world, "sum": float(t.item()), "node": os.environ["SLURMD_NODENAME"]}


def test_two_node_distributed_function_returns_every_rank(cluster: None, dev_profile: Path) -> None:
    job = slurmkit.Executor(profile=str(dev_profile), nodes=2, tasks_per_node=1, name="ddpfn").submit(
        allreduce_ranks, 10.0)
    results = job.results(timeout=300)
    assert [r["rank"] for r in results] == [0, 1] and {r["world"] for r in results} == {2}
    assert {r["sum"] for r in results} == {21.0}  # 10 + 11, all-reduced over both ranks
    assert {r["node"] for r in results} == {"node1", "node2"}


def counted_steps(steps: int, ckpt: slurmkit.Checkpoint) -> dict[str, Any]:
    """Each finished step is logged by rank 0 with its incarnation; the state is a running sum."""
    import time

    import torch
    import torch.distributed as dist

    rank, world, _ = slurmkit.distributed.init()
    ckpt.every = 5
    state = ckpt.restore() or {"step": 0, "total": torch.zeros(1)}
    log = Path(os.environ["SLURMKIT_RUN_DIR"]) / "steps.log"
    for step in range(state["step"], steps):
        t = torch.ones(1) * (step + 1)
        dist.all_reduce(t)  # both ranks add step + 1
        state = {"step": step + 1, "total": state["total"] + t}
        if rank == 0:
            with open(log, "a") as f:
                f.write(f"{step + 1} {os.environ.get('SLURM_RESTART_COUNT', '0')}\n")
        time.sleep(0.1)
        ckpt.step(step + 1, state)
    return {"total": float(state["total"].item()), "resumed_from": ckpt.resumed_step, "world": world}


def test_checkpoint_function_preempted_resumes_with_no_lost_steps(cluster: None, dev_profile: Path) -> None:
    steps = 60
    job = slurmkit.Executor(profile=str(dev_profile), nodes=2, name="ckptfn").submit(counted_steps, steps)
    log = Path(job.run_dir) / "steps.log"
    wait_until(lambda: log.exists() and len(log.read_text().splitlines()) >= 12, timeout_s=180, what="step 12",
               poll_s=0.2)
    subprocess.run(["scancel", "--signal=USR2", job.job_id], check=True)
    value = job.result(timeout=400)
    lines = [tuple(map(int, ln.split())) for ln in log.read_text().splitlines()]
    done = [s for s, _ in lines]
    assert done == list(range(1, steps + 1)), "a step was lost or recomputed"
    assert {inc for _, inc in lines} == {0, 1}  # two incarnations
    stopped = max(s for s, inc in lines if inc == 0)
    assert value["resumed_from"] == stopped and value["world"] == 2
    assert value["total"] == 2 * sum(range(1, steps + 1))
    record = RunFile(job.paths).read()
    assert len(record.restarts) == 1 and record.restarts[0].cause == "preemption"


class Counter:
    """submitit's documented Checkpointable pattern, as its docs write it (only the import and the
    executor lines would differ): state on self, checkpoint() returns the next call."""

    def __init__(self) -> None:
        self.done = 0
        self.starts: list[int] = []

    def __call__(self, n: int) -> tuple[int, list[int]]:
        import time

        self.starts.append(self.done)
        log = Path(os.environ["SLURMKIT_RUN_DIR"]) / "count.log"
        while self.done < n:
            self.done += 1
            with open(log, "a") as f:
                f.write(f"{self.done}\n")
            time.sleep(0.2)
        return self.done, self.starts

    def checkpoint(self, n: int) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(self, n)


def test_a_submitit_checkpointable_preempted_goes_on_where_it_stopped(cluster: None, dev_profile: Path) -> None:
    job = slurmkit.Executor(profile=str(dev_profile), name="counter").submit(Counter(), 40)
    log = Path(job.run_dir) / "count.log"
    wait_until(lambda: log.exists() and len(log.read_text().splitlines()) >= 8, timeout_s=180, what="count 8",
               poll_s=0.2)
    subprocess.run(["scancel", "--signal=USR2", job.job_id], check=True)
    done, starts = job.result(timeout=300)
    assert done == 40 and len(starts) == 2 and starts[0] == 0
    assert starts[1] >= 8  # the second incarnation began where checkpoint() left the count, not at 0
    record = RunFile(job.paths).read()
    assert [r.cause for r in record.restarts] == ["preemption"]


SUBMITIT_EXAMPLES = """
    import json, sys
    import slurmkit  # was: import submitit

    def add(a, b):
        return a + b

    if __name__ == "__main__":
        # submitit's README: an executor, update_parameters(timeout_min=1, slurm_partition=...), submit, result.
        executor = slurmkit.Executor(profile=sys.argv[1], time=1, partition="debug")  # was: AutoExecutor + update
        job = executor.submit(add, 5, 7)
        output = job.result()
        assert output == 12
        # submitit's job-array docs: slurm_array_parallelism=2, then map_array over two lists.
        executor = slurmkit.Executor(profile=sys.argv[1], max_parallel=2)  # was: update_parameters(...=2)
        jobs = executor.map_array(add, [1, 2, 3, 4], [10, 20, 30, 40])
        print(json.dumps({"single": output, "mapped": [j.result() for j in jobs],
                          "array_ids": sorted({j.job_id.split("_")[0] for j in jobs})}))
"""


def test_submitits_documented_examples_run_with_only_the_import_and_executor_lines_changed(
        cluster: None, tmp_path: Path, dev_profile: Path, run_root: Path) -> None:
    out = run_script(tmp_path, SUBMITIT_EXAMPLES, str(dev_profile))
    assert out["single"] == 12 and out["mapped"] == [11, 22, 33, 44]
    assert len(out["array_ids"]) == 1  # one Slurm job array, as submitit's map_array makes
    (sweep,) = list_sweeps(str(run_root))
    assert [a.array for a in ArrayLog(sweep).read().arrays] == ["0-3%2"]  # the executor's max_parallel


SNAPSHOT_DRIVER = """
    import json, subprocess, sys
    import slurmkit

    def version():
        import helper  # read at run time from the working directory: the snapshot, or the live tree
        return helper.VERSION

    if __name__ == "__main__":
        profile = sys.argv[1]
        held = {"sbatch_extra": ["--hold"], "time": "00:05:00"}
        snap = slurmkit.Executor(profile=profile, name="snap", snapshot=True, **held).submit(version)
        live = slurmkit.Executor(profile=profile, name="live", **held).submit(version)
        with open("helper.py", "w") as f:  # edited while both jobs are held
            f.write("VERSION = 2\\n")
        for job in (snap, live):
            subprocess.run(["scontrol", "release", job.job_id], check=True)
        print(json.dumps({"snap": snap.result(timeout=300), "live": live.result(timeout=300),
                          "run_dir": snap.run_dir, "run_id": snap.run_id}))
"""


def test_snapshot_runs_the_submitted_code_after_an_edit(cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "helper.py").write_text("VERSION = 1\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "helper.py"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "v1"],
                   check=True)
    out = run_script(repo, SNAPSHOT_DRIVER, str(dev_profile), cwd=repo)
    assert out["snap"] == 1 and out["live"] == 2  # the held snapshot run kept the submitted version
    record = RunFile(RunPaths(Path(out["run_dir"]))).read()
    snap = record.snapshot
    assert snap is not None
    assert snap["git_commit"] and snap["dirty"] is False and snap["files"] == 2  # helper.py and driver.py
    from typer.testing import CliRunner

    from slurmkit.cli.app import app

    status = CliRunner().invoke(app, ["status", out["run_id"], "-p", str(dev_profile), "--json"])
    assert json.loads(status.output)[0]["snapshot"]["git_commit"] == snap["git_commit"]
    # The CLI's report works on a run Python submitted, and shows what code it ran.
    report = CliRunner().invoke(app, ["report", out["run_id"], "-p", str(dev_profile), "--json"])
    assert report.exit_code == 0, report.output
    assert json.loads(report.output)["snapshot"]["files"] == 2
