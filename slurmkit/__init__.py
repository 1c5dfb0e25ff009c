"""slurmkit: Slurm-native job orchestration for PyTorch training.

The public Python API, imported on first use so that `import slurmkit` (and the CLI) stays
light and never imports torch:

    slurmkit.Executor (and slurmkit.Part), slurmkit.Job, slurmkit.as_completed, slurmkit.sweep, slurmkit.Checkpoint,
    slurmkit.distributed, slurmkit.tracking (its `log`), slurmkit.components (a heterogeneous job's
    parts), slurmkit.SlurmkitError (and the other errors of slurmkit.errors)
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Executor": "slurmkit.api.executor", "sweep": "slurmkit.api.executor", "Part": "slurmkit.api.executor",
    "Job": "slurmkit.api.handles", "as_completed": "slurmkit.api.handles", "SweepHandle": "slurmkit.api.handles",
    "Checkpoint": "slurmkit.worker.checkpoint", "components": "slurmkit.common.components",
    **{name: "slurmkit.errors" for name in ("SlurmkitError", "ConfigError", "JobFailedError", "SlurmError",
                                            "PreflightError", "RunNotFoundError")},
}
# The submodules come by `import slurmkit.distributed` (or lazily through __getattr__ below).
__all__ = [*_EXPORTS, "distributed", "checkpoint", "tracking"]  # noqa: F822


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    if name in ("distributed", "checkpoint", "tracking"):
        return importlib.import_module(f"slurmkit.worker.{name}")  # they run in the job
    raise AttributeError(f"module 'slurmkit' has no attribute {name!r}")
