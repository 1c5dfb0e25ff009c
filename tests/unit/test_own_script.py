"""A user's own torchrun-style code runs as it is from the Python API: every rank of a function run
has the env:// variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE),
a command is submitted with `submit_command`, a launcher with `launcher=` (issue 31, item 2).
Local profile, two ranks, gloo."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import slurmkit
from slurmkit.errors import ConfigError, JobFailedError

SPMD_SCRIPT = """\
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # env://, as under torchrun
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} sum {t.item():g}", flush=True)
dist.destroy_process_group()
"""


def spmd_main() -> dict[str, Any]:
    """What a torchrun user writes: no slurmkit call, init_process_group() from the environment."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    out = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    dist.destroy_process_group()
    return {**out, "sum": t.item()}


def test_a_function_that_calls_init_process_group_runs_with_no_slurmkit_call(local_profile: Path) -> None:
    ex = slurmkit.Executor(profile=str(local_profile), tasks_per_node=2)
    values = ex.submit(spmd_main).results(timeout=300)
    assert [(v["RANK"], v["WORLD_SIZE"], v["LOCAL_RANK"], v["LOCAL_WORLD_SIZE"]) for v in values] == [
        ("0", "2", "0", "2"), ("1", "2", "1", "2")]
    assert {v["sum"] for v in values} == {3.0}


def test_a_script_run_through_subprocess_from_a_function_gets_the_same_variables(tmp_path: Path,
                                                                                 local_profile: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(SPMD_SCRIPT)
    ex = slurmkit.Executor(profile=str(local_profile), tasks_per_node=2)
    done = ex.submit(subprocess.run, [sys.executable, str(script)], capture_output=True, text=True).results(
        timeout=300)
    assert [d.returncode for d in done] == [0, 0]
    assert sorted(d.stdout.strip() for d in done) == ["rank 0 of 2 sum 3", "rank 1 of 2 sum 3"]


def test_submit_command_runs_a_script_on_every_rank(tmp_path: Path, local_profile: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(SPMD_SCRIPT)
    job = slurmkit.Executor(profile=str(local_profile), tasks_per_node=2).submit_command(
        [sys.executable, str(script)])
    assert job.run_id.startswith("python")
    outs = job.results(timeout=300)
    assert [o["returncode"] for o in outs] == [0, 0]
    assert [o["stdout"].strip() for o in outs] == ["rank 0 of 2 sum 3", "rank 1 of 2 sum 3"]


# libstdc++'s last words when a thread is ended inside C++ code that may not throw.
TORCH_EXIT_ABORT = "terminate called without an active exception"


def _aborted_after_its_work(err: JobFailedError, last_line: str) -> bool:
    """torch's abort in Python's finalization, after the rank's whole output (docs/fault-tolerance.md,
    "Its exit is looked after too"): a plain DDP script's gloo thread, taking the GIL there. Nothing
    of slurmkit runs in that process; on Slurm the in-job restart answers it, the local profile has none."""
    return err.trace[-1:] == (TORCH_EXIT_ABORT,) and last_line in err.log_tail


def test_a_users_own_ddp_script_runs_unmodified_on_the_local_profile(local_profile: Path) -> None:
    """tests/user_code/ddp_toy.py, which knows nothing of slurmkit, trains DDP on 2 local ranks. Run
    again once, loudly, where torch aborted a rank in its finalization after the rank's last line
    (1 rank in 40 to 80 here, more under load): that abort is torch's, in a process with no slurmkit."""
    script = Path(__file__).parents[1] / "user_code" / "ddp_toy.py"
    want = [f"rank={r} world=2 local={r} steps=3 weights_equal=True" for r in range(2)]
    for attempt in (1, 2):
        job = slurmkit.Executor(profile=str(local_profile), tasks_per_node=2).submit_command(
            ["python", str(script), "--steps", "3"])
        try:
            outs = [o["stdout"].strip().splitlines()[-1] for o in job.results(timeout=300)]
            break
        except JobFailedError as err:
            if attempt == 2 or err.rank is None or not _aborted_after_its_work(err, want[err.rank]):
                raise
            print(f"RUN AGAIN: torch aborted rank {err.rank} after its last line ({TORCH_EXIT_ABORT!r})",
                  file=sys.stderr)
    assert outs == want


STAND_IN_ABORT = f"""\
import os, sys
print("rank=" + os.environ["RANK"] + " done", flush=True)
if os.environ["RANK"] == "1":
    sys.stderr.write({TORCH_EXIT_ABORT!r} + "\\n")
    sys.stderr.flush()
    os.abort()
"""


def test_the_run_again_above_knows_torchs_exit_abort_from_a_crash(tmp_path: Path, local_profile: Path) -> None:
    """A stand-in for torch's abort (its line on stderr, then SIGABRT) after the rank's last line is
    what the test above runs again for; the same abort before that line is not."""
    script = tmp_path / "abort.py"
    script.write_text(STAND_IN_ABORT)
    with pytest.raises(JobFailedError) as err:
        slurmkit.Executor(profile=str(local_profile), tasks_per_node=2).submit_command(
            [sys.executable, str(script)]).results(timeout=300)
    assert err.value.rank == 1
    assert _aborted_after_its_work(err.value, "rank=1 done")
    assert not _aborted_after_its_work(err.value, "rank=1 step=3")


def test_launcher_is_a_keyword(dev_profile: Path) -> None:
    ex = slurmkit.Executor(profile=str(dev_profile), launcher="torchrun")  # resolved only: no cluster asked
    assert ex.resolve(spmd_main).spec.launcher == "torchrun"
    assert ex.update(launcher="srun").resolve(spmd_main).spec.launcher == "srun"
    with pytest.raises(ConfigError) as err:
        slurmkit.Executor(profile=str(dev_profile), launcher="mpirun")
    assert err.value.where is not None and "launcher" in err.value.where


def test_every_submitit_executor_parameter_is_slurmkits_or_points_at_it(local_profile: Path) -> None:
    """Read from submitit itself: AutoExecutor's parameters and every slurm_* one."""
    from submitit.auto.auto import AutoExecutor
    from submitit.slurm.slurm import SlurmExecutor

    from slurmkit.api import submitit_names

    names = {"folder", "cluster", *AutoExecutor._valid_parameters(),
             *(f"slurm_{p}" for p in SlurmExecutor._valid_parameters())}
    pointed = 0
    for name in sorted(names):
        try:
            slurmkit.Executor(profile=str(local_profile), **{name: 1})
        except ConfigError as err:
            if err.where != "Executor":  # a field of slurmkit's too, refusing the value 1: not a name error
                continue
            assert submitit_names.keyword_hint(name, []) or name.removeprefix("slurm_") in err.what, name
            pointed += 1
    assert pointed >= 30  # the loop met the submitit names, not only slurmkit's own


def test_submitit_methods_point_at_slurmkits(local_profile: Path) -> None:
    from slurmkit.api import submitit_names

    ex = slurmkit.Executor(profile=str(local_profile))
    for name in submitit_names.EXECUTOR_METHODS:
        with pytest.raises(AttributeError) as err:
            getattr(ex, name)
        assert submitit_names.EXECUTOR_METHODS[name] in str(err.value)
    job = slurmkit.Job("r", "1", "/nonexistent")
    for name in submitit_names.JOB_METHODS:
        with pytest.raises(AttributeError) as err:
            getattr(job, name)
        assert submitit_names.JOB_METHODS[name] in str(err.value)
    with pytest.raises(AttributeError):
        job.no_such_thing  # noqa: B018 - a name neither has: the plain AttributeError


class Counter:
    """submitit's documented Checkpointable pattern (a class with checkpoint())."""

    def __call__(self, n: int) -> int:
        return n

    def checkpoint(self, n: int) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(self, n)


def test_a_checkpointable_stopped_on_rank_0_keeps_its_next_call_for_the_next_incarnation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The preempted run itself is in test_cluster_python_api; here, who keeps what."""
    from slurmkit.common.layout import RunPaths
    from slurmkit.worker.ft import checkpointable

    paths = RunPaths(tmp_path / "run")
    paths.run_dir.mkdir(mode=0o700)
    counter = Counter()
    assert checkpointable.load(paths, counter, (3,), {}) == (counter, (3,), {})  # nothing kept: as submitted
    monkeypatch.setenv("SLURM_PROCID", "1")
    assert not checkpointable.save(paths, counter, (3,), {})  # rank 0 asks, as submitit's does
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert not checkpointable.save(paths, spmd_main, (), {})  # not a Checkpointable
    assert checkpointable.save(paths, counter, (3,), {})
    fn, args, kwargs = checkpointable.load(paths, spmd_main, (), {})
    assert isinstance(fn, Counter) and (args, kwargs) == ((3,), {})


def test_from_submitit_md_covers_every_name_slurmkit_points_at_it() -> None:
    from slurmkit.api import submitit_names
    from tests.conftest import ROOT

    doc = (ROOT / "docs" / "from-submitit.md").read_text()
    names = [*submitit_names.EXECUTOR_KEYWORDS, *submitit_names.EXECUTOR_METHODS, *submitit_names.JOB_METHODS]
    assert [n for n in names if n not in doc] == []


def test_a_commands_python_is_the_profiles_interpreter(tmp_path: Path, local_profile: Path) -> None:
    """Not whichever `python` the batch shell's PATH finds first (here a pyenv shim, elsewhere a
    system Python without torch): the ranks' own, as an activated venv would give."""
    job = slurmkit.Executor(profile=str(local_profile)).submit_command("python -c 'import sys; print(sys.prefix)'")
    assert job.result(timeout=120)["stdout"].strip() == sys.prefix
