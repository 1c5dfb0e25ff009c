"""The submitit private hooks slurmkit relies on, checked without a cluster (pyproject pins the
range; test_cluster_jobs.py::test_submitted_file_is_our_render checks them end to end)."""

from __future__ import annotations

import inspect
from importlib.metadata import version

import submitit
from submitit.core import core

from slurmkit.slurm.submitit_executor import RenderedSlurmExecutor


def test_submitit_is_in_the_pinned_range() -> None:
    major, minor, *_ = (int(p) for p in version("submitit").split(".")[:3])
    assert (1, 5) <= (major, minor) < (1, 6)


def test_submit_command_writes_our_text_and_runs_our_command() -> None:
    # submitit's _submit_command writes _make_submission_file_text's text, then runs
    # _make_submission_command's argv: the two hooks RenderedSlurmExecutor overrides.
    source = inspect.getsource(core.PicklingExecutor._submit_command)
    assert "self._make_submission_file_text(command, tmp_uuid)" in source
    assert "command_list = self._make_submission_command(submission_file_path)" in source
    for hook in ("_make_submission_file_text", "_make_submission_command", "_internal_process_submissions",
                 "_num_tasks"):
        ours, theirs = getattr(RenderedSlurmExecutor, hook), getattr(submitit.SlurmExecutor, hook)
        assert ours is not theirs, f"{hook} is not overridden"
        assert list(inspect.signature(ours).parameters) == list(inspect.signature(theirs).parameters), hook
