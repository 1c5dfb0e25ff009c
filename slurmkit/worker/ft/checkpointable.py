"""submitit's Checkpointable, honoured: a submitted callable with `checkpoint(*args, **kwargs)`
(submitit.helpers.Checkpointable, or any object submitit would take for one) is asked, on the stop
signal that requeues the job, what to run next; the next incarnation runs that instead of the
submitted call, its state included. As submitit does: rank 0 asks, every rank of the next
incarnation runs the answer (a `DelayedSubmission`). Budgets are the profile's, per cause.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import cloudpickle

from slurmkit import trust
from slurmkit.common import perms
from slurmkit.common.atomic import atomic_write
from slurmkit.common.layout import RunPaths
from slurmkit.jsontypes import JsonObject

Call = tuple[Any, tuple[Any, ...], JsonObject]


def is_checkpointable(fn: object) -> bool:
    """What submitit takes for a Checkpointable (its JobEnvironment checks the same attribute)."""
    return callable(getattr(fn, "__submitit_checkpoint__", None) or getattr(fn, "checkpoint", None))


def save(paths: RunPaths, fn: Any, args: tuple[Any, ...], kwargs: Mapping[str, object]) -> bool:
    """Rank 0, stopping for a requeue: ask fn for its next call and keep it for the next incarnation.
    False when there is none to keep (not rank 0, or checkpoint() answered None)."""
    if os.environ.get("SLURM_PROCID", "0") != "0" or not is_checkpointable(fn):
        return False
    ask = getattr(fn, "__submitit_checkpoint__", None) or fn.checkpoint
    delayed = ask(*args, **kwargs)
    if delayed is None:
        return False
    call: Call = (delayed.function, tuple(delayed.args), dict(delayed.kwargs))
    atomic_write(paths.resume_call, cloudpickle.dumps(call), perms.file_mode(paths.run_dir))
    return True


def load(paths: RunPaths, fn: object, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
    """The call this incarnation runs: the one the last stop kept, else the submitted one. Unpickled
    only from the caller's own file, in a folder no one else can write (trust.load_pickle)."""
    if not paths.resume_call.exists():
        return fn, args, kwargs
    call: Call = trust.load_pickle(paths.resume_call, "a Checkpointable's next call", (paths.run_dir,))
    return call
