"""The metrics file: JSON lines written by rank 0, read by `report`, goodput, `status`, sweep results
and the requeue policy. One record per logged step, plus start-up and fault records; each carries
its wall-clock `time`. A line cut by a kill is skipped by every reader.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, TextIO


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every record of a JSONL metrics file; a line cut by a kill is skipped, a missing file is empty."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def last_record(path: Path) -> dict[str, Any] | None:
    """The newest complete record, parsing from the end (a file can hold many thousands of steps)."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            record: dict[str, Any] = json.loads(line)
            return record
        except ValueError:
            continue
    return None


class MetricsWriter:
    """Appends one JSON line per step; only rank 0 writes, everyone may call it."""

    def __init__(self, path: Path | None, enabled: bool) -> None:
        self._file: TextIO | None = None
        if enabled and path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the writer

    def write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps({"time": round(time.time(), 3), **record}) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
