"""submitit integration: submitit pickles the callable and owns the job folder, but the sbatch
text it submits is our Jinja render.

The hook is submitit's private `_make_submission_file_text`; pyproject pins submitit to a tested
range and tests/test_executor_hook.py fails if the hook stops being used.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import JobPaths

from slurmkit.config.fields import time_to_minutes
from slurmkit.config.loader import Resolved
from slurmkit.render import JobFiles, RenderInput, render

SBATCH_TIMEOUT_S = 60


def python_command(resolved: Resolved) -> str:
    return shlex.quote(resolved.profile.python or sys.executable)


def submitit_command(python: str, folder: Path) -> str:
    """The command submitit runs on each rank (mirrors SlurmExecutor._submitit_command_str)."""
    return " ".join([python, "-u -m submitit.core._submit", shlex.quote(str(folder))])


def job_files(folder: Path, array: bool = False) -> JobFiles:
    """Log patterns in submitit's JobPaths layout, so submitit's own stdout()/stderr() find them."""
    paths = JobPaths(folder=folder)
    out, err = str(paths.stdout), str(paths.stderr)
    if array:
        out, err = out.replace("%j", "%A_%a"), err.replace("%j", "%A_%a")
    return JobFiles(out.replace("%t", "0"), err.replace("%t", "0"), out, err)


def render_for(resolved: Resolved, folder: Path, command: str, array: str | None = None) -> str:
    """The script for a run whose submitit folder is `folder` (inside the run folder)."""
    return render(RenderInput(resolved, command, job_files(folder, array is not None), python_command(resolved),
                              str(folder.parent), array=array))


class RenderedSlurmExecutor(submitit.SlurmExecutor):
    """A SlurmExecutor whose submission file is slurmkit's rendered script."""

    def __init__(self, folder: Path, resolved: Resolved) -> None:
        super().__init__(folder, max_num_timeout=resolved.profile.requeue.timeout,
                         python=python_command(resolved))
        self.resolved = resolved
        self.last_script: str | None = None
        r = resolved.resources
        assert r.time is not None
        # submitit reads these for the task count and its own timeout bookkeeping; the script
        # itself comes from render().
        self.update_parameters(nodes=r.nodes, ntasks_per_node=r.tasks_per_node, time=time_to_minutes(r.time))

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        self.last_script = render_for(self.resolved, Path(self.folder), command)
        return self.last_script

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        # submitit runs this itself without a timeout; coreutils timeout bounds a hung slurmctld.
        return ["timeout", "--kill-after=5", str(SBATCH_TIMEOUT_S), "sbatch", str(submission_file_path)]


def local_executor(folder: Path, resolved: Resolved) -> Any:
    """submitit's LocalExecutor: every rank a process on this machine."""
    ex = submitit.LocalExecutor(folder, max_num_timeout=resolved.profile.requeue.timeout,
                                python=python_command(resolved))
    r = resolved.resources
    assert r.time is not None
    ex.update_parameters(tasks_per_node=resolved.num_tasks, timeout_min=time_to_minutes(r.time),
                         signal_delay_s=resolved.profile.signal_delay_s)
    return ex
