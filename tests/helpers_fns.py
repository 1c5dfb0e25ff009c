"""Callables that tests submit; importable on the compute nodes (tests/ is on their sys.path)."""

from __future__ import annotations

import os
import socket
import time


def add(a: int, b: int) -> dict[str, object]:
    return {"sum": a + b, "host": socket.gethostname(), "rank": int(os.environ.get("SLURM_PROCID", "0"))}


def sleep(seconds: float) -> str:
    time.sleep(seconds)
    return "slept"


def fail(message: str) -> None:
    raise ValueError(message)
