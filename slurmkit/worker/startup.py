"""Where a rank's start-up time goes.

Restart-to-first-step is lost time on every requeue. `mark()` stamps phases relative to the
process start, so the first step's metrics record can say where the seconds went (the report and
the goodput benchmark read it).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from slurmkit.jsontypes import JsonObject
from slurmkit.worker.ft.watchdog import StartupWatch

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


def restart_clock() -> None:
    """A standby process takes over a rank now (slurmkit.worker.standby): its phases count from
    here, since its imports were paid while it waited."""
    global _START
    _START = time.time()
    _MARKS.clear()


def marks() -> dict[str, float]:
    """Seconds from the process start to the end of each phase marked so far, in order."""
    return dict(_MARKS)


def compile_seconds() -> float:
    """Seconds this process has spent in torch.compile so far (Dynamo's own record of its frames,
    Inductor's code generation inside them); read where torch is already imported, never imported."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is None:  # nothing was compiled
        return 0.0
    return round(sum(dynamo.compilation_time_metrics.get("_compile.compile_inner", [])), 3)


def first_step_hook(trainer: Any, record: JsonObject) -> None:
    """Trainer hook: the first step of this process carries the start-up phases, then it unhooks.
    With config.compile the first step compiles: `compile` ends the seconds torch.compile took in it."""
    first = round(time.time() - _START - record["step_s"], 3)
    record["startup"] = {"process_start": round(_START, 3), **marks(), "first_step": first}
    if spent := compile_seconds():
        record["startup"]["compile"] = round(first + spent, 3)
        record["compile_cache"] = compile_cache_counts()
    trainer.hooks.remove(first_step_hook)
    StartupWatch.end()


def compile_cache_counts() -> dict[str, int]:
    """Compiled graphs this process loaded from the run's compile cache (hits) and compiled anew
    (misses): a restart whose misses are 0 paid no code generation."""
    counters = sys.modules["torch._dynamo.utils"].counters["inductor"]
    return {"hits": int(counters["fxgraph_cache_hit"]), "misses": int(counters["fxgraph_cache_miss"])}
