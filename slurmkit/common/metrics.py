"""The metrics file: JSON lines written by rank 0, read by `report`, goodput, `status`, sweep results
and the requeue policy.

A record covers an interval of steps, `step - steps + 1` to `step`, and carries their aggregates:
- `steps`; `step_s` (the median step of the interval), `step_s_min`, `step_s_max`, `step_s_sum`;
- `loss` (the mean over the interval's steps and every rank), `ckpt_stall_s` (a sum);
- `samples`, `tokens`, and rates over the interval from its sums: `samples_per_s`, `tokens_per_s`,
  `mfu`; `lr` at its end;
- its wall-clock `time`, when the interval ended.

Sums (step time, stall, steps) stay exact whatever the interval; medians are exact within one
interval. The first step of each process (it carries `startup`), the last step, the step a run stops
at and a step whose hook failed each end an interval, so those records are always written. Files
written before intervals existed have one record per step without `steps`: readers take 1.

Readers stream: memory does not grow with the file, and the tail is read from the end. A line cut by
a kill is skipped by every reader.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TextIO

from slurmkit import trust
from slurmkit.jsontypes import JsonObject

_BLOCK = 1 << 16


def iter_records(path: Path) -> Iterator[JsonObject]:
    """Every record, oldest first, one line in memory at a time; a missing file has none."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed by the with below, after the open can fail
    except FileNotFoundError:
        return
    with fh:
        for line in fh:
            record = _parse(line)
            if record is not None:
                yield record


def iter_records_reversed(path: Path) -> Iterator[JsonObject]:
    """Every record, newest first, read backwards in blocks (the tail costs no scan of the file)."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except FileNotFoundError:
        return
    with fh:
        end = fh.seek(0, os.SEEK_END)
        rest = b""
        while end > 0:
            start = max(0, end - _BLOCK)
            fh.seek(start)
            chunk = fh.read(end - start) + rest
            end = start
            lines = chunk.split(b"\n")
            rest = lines.pop(0) if start > 0 else b""  # may be the end of a line that began earlier
            for line in reversed(lines):
                record = _parse(line)
                if record is not None:
                    yield record


def _parse(line: bytes) -> JsonObject | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def read_records(path: Path) -> list[JsonObject]:
    """Every record in a list (for small files and tests; the readers of a run stream)."""
    return list(iter_records(path))


def last_record(path: Path) -> JsonObject | None:
    """The newest complete record, read from the end of the file."""
    return next(iter_records_reversed(path), None)


def is_number(value: object) -> bool:
    """An int or a float, not a bool (JSON's true is no metric)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def numbers(record: JsonObject) -> dict[str, float]:
    """A record's values a tracker or a report plots: numbers, not the step bookkeeping."""
    skip = {"time", "step", "steps"}
    return {k: float(v) for k, v in record.items() if k not in skip and is_number(v)}


LAST_VALUES_SCAN = 1000
"""How many of the newest records last_values reads back through."""


def last_values(path: Path, scan: int = LAST_VALUES_SCAN) -> dict[str, float | int]:
    """The newest value of each number among the newest `scan` records (a value logged once an
    epoch is still found behind a thousand per-step ones), `time` left out."""
    found: dict[str, float | int] = {}
    for i, record in enumerate(iter_records_reversed(path)):
        if i >= scan:
            break
        for key, value in record.items():
            if key != "time" and key not in found and is_number(value):
                found[key] = value
    return found


def steps_of(record: JsonObject) -> int:
    """How many steps a record covers (1 in files from before intervals)."""
    return int(record.get("steps", 1))


def busy_s(record: JsonObject) -> float:
    """Seconds the record's steps took together, less what the first step of a process spent in
    torch.compile (its `startup` record's compile phase): a restart's cost, not training."""
    spent = float(record["step_s_sum"] if "step_s_sum" in record else record.get("step_s", 0.0))
    startup = record.get("startup")
    if isinstance(startup, dict) and "compile" in startup and "first_step" in startup:
        spent -= max(0.0, float(startup["compile"]) - float(startup["first_step"]))
    return max(0.0, spent)


class Interval:
    """What rank 0 accumulates between two records, and when the next record is due.

    `due` holds a record back until `every` steps have passed and `min_interval_s` seconds since the
    previous one (0: every `every` steps); `add(..., force=True)` ends the interval now.
    """

    def __init__(self, every: int = 1, min_interval_s: float = 0.0) -> None:
        self.every, self.min_interval_s = every, min_interval_s
        self._last_flush = time.monotonic()
        self._step = 0
        self._times: list[float] = []
        self._loss = 0.0
        self._losses: list[float] = []
        self._stall = 0.0
        self._extra: JsonObject = {}

    def add(self, step: int, step_s: float, loss: float, extra: JsonObject | None = None,
            force: bool = False) -> JsonObject | None:
        """Count one step (`extra`: ckpt_stall_s, summed, and keys kept as they are); the record if due."""
        self._step = step
        self._times.append(step_s)
        self._loss += loss
        self._losses.append(loss)
        if extra:
            for key, value in extra.items():
                if key == "ckpt_stall_s":
                    self._stall += value
                else:
                    self._extra[key] = value
        if not (force or (step % self.every == 0 and time.monotonic() - self._last_flush >= self.min_interval_s)):
            return None
        return self._record()

    def flush(self) -> JsonObject | None:
        """End the interval now (after a failure); None if it holds no step."""
        return self._record() if self._times else None

    def _record(self) -> JsonObject:
        times, n = self._times, len(self._times)
        total = sum(times)
        # A hook's own keys never replace the aggregates.
        record = {**self._extra, "step": self._step, "steps": n, "loss": self._loss / n,
                  "step_s": times[0] if n == 1 else statistics.median(times),
                  "loss_min": min(self._losses), "loss_max": max(self._losses),
                  "step_s_min": min(times), "step_s_max": max(times), "step_s_sum": total,
                  "ckpt_stall_s": self._stall}
        self._times, self._loss, self._losses, self._stall, self._extra = [], 0.0, [], 0.0, {}
        self._last_flush = time.monotonic()
        return record


class MetricsWriter:
    """Appends one JSON line per record; only rank 0 writes, everyone may call it."""

    def __init__(self, path: Path | None, enabled: bool) -> None:
        self._file: TextIO | None = None
        self.sinks: list[Callable[[JsonObject], None]] = []
        """Each written record is also handed to these (the run's trackers, worker.tracking)."""
        if enabled and path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Lives as long as the writer; never through a symlink planted at its name.
            self._file = os.fdopen(trust.open_append(path), "a", buffering=1)

    @property
    def enabled(self) -> bool:
        return self._file is not None

    def write(self, record: Mapping[str, object]) -> None:
        if self._file is not None:
            stamped = {"time": round(time.time(), 3), **record}
            self._file.write(json.dumps(stamped) + "\n")
            for sink in self.sinks:
                sink(stamped)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
