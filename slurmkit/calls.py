"""The callables submitit pickles on the client and calls on every rank: small records whose
`__call__` loads the job's side where it runs (slurmkit.worker.entry, slurmkit.worker.sweep_task).
The client that builds them imports none of it: a submit loads no worker module into the login
process (tests/unit/test_common.py holds it), and submitit's pickle names only this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slurmkit.common.work import Work


@dataclass
class Run:
    """What every rank of a run executes (worker.entry.run); rank 0's return value is the run's result."""

    work: Work
    run_dir: str
    env: dict[str, str] = field(default_factory=dict)
    checkpoint_uri: str | None = None
    code_dir: str | None = None
    """The run's code snapshot: the working directory and first import path of every incarnation."""

    def __call__(self) -> Any:
        from slurmkit.worker.entry import run  # the job's side, loaded on the rank that calls this

        return run(self)


@dataclass(frozen=True)
class SweepTask:
    """The callable of every task of one array: sweep task base + SLURM_ARRAY_TASK_ID (or index),
    whose Run the job's side builds from the sweep's manifest (worker.sweep_task.task_run)."""

    sweep_dir: str
    base: int = 0
    index: int | None = None

    def __call__(self) -> Any:
        from slurmkit.worker.sweep_task import task_run  # the job's side, loaded on the rank that calls this

        return Run(**task_run(self.sweep_dir, self.base, self.index))()
