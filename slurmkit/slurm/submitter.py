"""The one door to slurmkit.slurm.submitit_executor (submitit and its pickling, ~0.3 s): imported
on the way to an sbatch (or a local start) only, so no other command pays for it."""

from __future__ import annotations

from types import ModuleType


def submitter() -> ModuleType:
    from slurmkit.slurm import submitit_executor

    return submitit_executor
