"""Where a rank's start-up time goes, and one way to spend less of it.

Restart-to-first-step is lost time on every requeue. `mark()` stamps phases relative to the
process start, so the first step's metrics record can say where the seconds went (the report and
the goodput benchmark read it). `defer_dynamo_import()` avoids torch._dynamo's import (about 2 s,
~800 modules, here) that torch's optimizers otherwise trigger on their first call.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Any

_MARKS: dict[str, float] = {}


def process_start() -> float:
    """Wall-clock time at which this process began (from /proc); now, where /proc is missing."""
    try:
        with open("/proc/self/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        age = 0.0
    return time.time() - max(0.0, age)


_START = process_start()


def mark(phase: str) -> None:
    """Record that `phase` ended now (a later run in the same process marks it again)."""
    _MARKS[phase] = round(time.time() - _START, 3)


def marks() -> dict[str, float]:
    """Seconds from the process start to the end of each phase marked so far, in order."""
    return dict(_MARKS)


def defer_dynamo_import() -> int:
    """Let torch's `_disable_dynamo` functions run without importing torch._dynamo; returns how many.

    torch wraps optimizer methods (and a few others) so that dynamo never traces them; the
    wrapper imports torch._dynamo on its first call to build the disabled version. While
    torch._dynamo has never been imported no frame hook can be active, so calling the function
    itself is exactly what the disabled version would do. Each wrapper gets a shim that does
    that, and hands over to torch's own disabled version as soon as torch._dynamo is loaded
    (torch.compile imports it), so compiled code keeps its guarantees.
    """
    if "torch._dynamo" in sys.modules:
        return 0
    import gc

    import torch._compile as tc

    inner = next((c for c in tc._disable_dynamo.__code__.co_consts
                  if getattr(c, "co_name", None) == "inner" and c.co_freevars == ("fn", "recursive")), None)
    if inner is None:  # another torch: leave it alone
        return 0
    seeded = 0
    for wrapper in gc.get_referrers(inner):
        closure = getattr(wrapper, "__closure__", None)
        if getattr(wrapper, "__code__", None) is not inner or not closure:
            continue
        fn, recursive = (cell.cell_contents for cell in closure)
        if getattr(fn, "__dynamo_disable", None) is None:
            fn.__dynamo_disable = _shim(fn, recursive)
            seeded += 1
    return seeded


def preload_dynamo() -> threading.Thread | None:
    """Import torch._dynamo in a background thread: the first optimizer step needs it anyway.

    The import is Python work, so it only gains where the main thread waits with the GIL
    released: the rendezvous, CUDA and NCCL set-up, checkpoint reads. Start it once the main
    thread's own imports are done, so the two never import the same modules at once.
    """
    if "torch._dynamo" in sys.modules:
        return None

    def work() -> None:
        # A failure here is left to the optimizer's own import, which raises it where it belongs.
        with contextlib.suppress(Exception):
            import torch._dynamo  # noqa: F401

    thread = threading.Thread(target=work, name="slurmkit-preload-dynamo", daemon=True)
    thread.start()
    return thread


def _shim(fn: Any, recursive: bool) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is None or getattr(dynamo.__spec__, "_initializing", False):  # not (fully) loaded yet
            return fn(*args, **kwargs)
        disabled = dynamo.disable(fn, recursive, wrapping=False)
        fn.__dynamo_disable = disabled
        return disabled(*args, **kwargs)

    return call


def first_step_hook(trainer: Any, record: dict[str, Any]) -> None:
    """Trainer hook: the first step of this process carries the start-up phases, then it unhooks."""
    record["startup"] = {"process_start": round(_START, 3), **marks(),
                         "first_step": round(time.time() - _START - record["step_s"], 3)}
    trainer.hooks.remove(first_step_hook)
