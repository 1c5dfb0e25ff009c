"""A failure says its cause: the failing rank, the exception (or a command's exit code and the
exception its Python printed) and the user's own last frames, slurmkit's and submitit's cut
(issue 31, item 1). Local profile: the same records and code paths a Slurm run uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import slurmkit
from slurmkit.cli.app import app
from slurmkit.common import user_trace as cause
from slurmkit.common.outcomes import Outcome
from slurmkit.runs.failure import blamed
from tests.conftest import write_spec

runner = CliRunner()


def progress_then_fail() -> None:
    for i in range(50):
        print(f"progress {i}", flush=True)
    raise ValueError("bad input")


def test_a_function_that_raises_leads_with_its_exception_and_own_frames(local_profile: Path) -> None:
    job = slurmkit.Executor(profile=str(local_profile), name="cause").submit(progress_then_fail)
    with pytest.raises(slurmkit.JobFailedError) as err:
        job.result(timeout=120)
    failed = err.value
    assert (failed.rank, failed.cause) == (0, "ValueError: bad input")
    # Pickled by value, its code names this file again on the rank (common.code_source): its line shows.
    assert failed.trace[-1].startswith(f'File "{__file__}", line ') and "in progress_then_fail" in failed.trace[-1]
    assert failed.trace[-1].splitlines()[-1].strip().startswith("raise ValueError")
    assert not any("/slurmkit/" in f or "/submitit/" in f for f in failed.trace)  # their own frames are cut
    assert "ValueError: bad input" in failed.log_tail and "progress 49" in failed.log_tail
    assert "ValueError: bad input" in str(failed).splitlines()[0]
    full = failed.details(verbose=True)  # --verbose: the whole traceback, slurmkit's own frames too
    assert any("/slurmkit/" in ln for ln in full) and "ValueError: bad input" in full
    assert full[full.index(f"-- rank {failed.rank}'s last output --") + 1:] == failed.log_tail.splitlines()


def test_result_shows_slurmkits_frames_only_with_verbose(local_profile: Path) -> None:
    job = slurmkit.Executor(profile=str(local_profile), name="cause").submit(progress_then_fail)
    job.wait(timeout=120)
    short, verbose = (runner.invoke(app, ["result", job.run_id, "-p", str(local_profile), *flag])
                      for flag in ([], ["--verbose"]))
    assert short.exit_code == verbose.exit_code == 4
    assert "/slurmkit/" not in short.stderr and "/slurmkit/" in verbose.stderr


def test_a_command_that_fails_says_its_exit_code_and_its_pythons_exception(tmp_path: Path,
                                                                             local_profile: Path) -> None:
    spec = write_spec(tmp_path, name="nomod", command="python -c 'import nonexistent_mod'")
    result = runner.invoke(app, ["submit", str(spec), "-p", str(local_profile), "--wait"])
    assert result.exit_code == 4, result.output
    status = runner.invoke(app, ["status", "-p", str(local_profile), "--json"])
    (row,) = json.loads(status.stdout)
    assert row["state"] == "FAILED"
    assert row["cause"] == "rank 0: exit code 1: ModuleNotFoundError: No module named 'nonexistent_mod'"


def test_a_traceback_in_a_log_is_read_to_its_last_exception() -> None:
    chained = ("Traceback (most recent call last):\n  File \"/u/a.py\", line 3, in load\n    open(p)\n"
               "FileNotFoundError: [Errno 2] x\n\nDuring handling of the above exception, another exception "
               "occurred:\n\nTraceback (most recent call last):\n  File \"/u/a.py\", line 9, in main\n"
               "    load()\n    ^^^^^^\nRuntimeError: no data\n")
    assert cause.in_text(chained) == ("RuntimeError: no data", ['File "/u/a.py", line 9, in main\n    load()'])
    assert cause.in_text("plain output\n") is None
    # A rank with a process group: torch.distributed's excepthook prefixes every line with its rank.
    prefixed = "".join(f"[rank1]: {ln}\n" for ln in chained.splitlines())
    assert cause.in_text(prefixed) == cause.in_text(chained)
    assert cause.of_command(137, "Killed\n") == ("exit code 137", ["Killed"])


def test_the_rank_blamed_is_the_one_whose_own_error_it_was() -> None:
    peer = Outcome(state="error", error="RuntimeError: Connection reset by peer")
    own = Outcome(state="error", error="ValueError: x", cause="ValueError: x")
    assert blamed([(0, peer), (1, own), (2, None)]) == (1, own)
    assert blamed([(0, Outcome(state="success", returncode=0)), (1, None)]) == (1, None)
    assert blamed([(0, peer), (1, None)]) == (0, peer)
