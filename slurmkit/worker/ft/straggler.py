"""Stragglers: each rank times its own work; about every PERIOD_S the ranks share their medians on
the run's store, from a thread that never blocks training; rank 0 scores them and names a slow rank.

- Own work: for the Trainer, its forward passes and its optimizer step, never the wait in the
  gradient all-reduce (a fast rank waits there for the slow one); for a slurmkit.Checkpoint, the
  time between step boundaries less what its own stop vote waited.
- Score: the fastest rank's median divided by this rank's, so 1.0 is the fastest.
- Named: a rank below the profile's straggler_score (SLURMKIT_STRAGGLER_SCORE; 0.7; 0: off) for
  READINGS readings in a row. Rank 0 says so in its log, writes the run's stragglers.json
  (common.markers.Stragglers: `slurmkit status` shows it) and blames its node in the user's node
  ledger; a rank back above the score is no longer named.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import Straggler, Stragglers
from slurmkit.common.node_ledger import blame_here
from slurmkit.common.slurm_env import STRAGGLER_SCORE_ENV
from slurmkit.worker.process_group import Dist

PERIOD_ENV = "SLURMKIT_STRAGGLER_PERIOD_S"
DEFAULT_SCORE, PERIOD_S, READINGS, KEEP = 0.7, 10.0, 3, 64


class OwnTime:
    """This rank's own work per step, the last KEEP steps."""

    def __init__(self) -> None:
        self._times: deque[float] = deque(maxlen=KEEP)

    def add(self, seconds: float) -> None:
        self._times.append(seconds)

    def median(self) -> float | None:
        times = list(self._times)  # a copy: the sharing thread reads while training appends
        return statistics.median(times) if times else None


OWN = OwnTime()
"""This process's: the Trainer and slurmkit.Checkpoint add to it, the sharing thread reads it."""


class BoundaryClock:
    """A step boundary's own-work clock (a slurmkit.Checkpoint's): from the end of the last boundary
    to the start of this one, so neither the stop vote's wait nor a save counts."""

    def __init__(self) -> None:
        self._left: float | None = None

    def arrived(self) -> None:
        if self._left is not None:
            OWN.add(time.perf_counter() - self._left)

    def left(self) -> None:
        self._left = time.perf_counter()


@dataclass(frozen=True)
class Pace:
    rank: int
    node: str
    median_s: float


def scores(paces: list[Pace]) -> dict[int, float]:
    """Each rank's score: the fastest median over its own (1.0: the fastest)."""
    fastest = min((p.median_s for p in paces), default=0.0)
    return {p.rank: (fastest / p.median_s if p.median_s > 0 else 1.0) for p in paces}


class Watch:
    """Who is named: a rank below `threshold` for `readings` readings in a row, since the first of them."""

    def __init__(self, threshold: float, readings: int = READINGS) -> None:
        self.threshold, self.readings = threshold, readings
        self._below: dict[int, tuple[int, float]] = {}  # rank -> (readings in a row, since)

    def update(self, paces: list[Pace], now: float) -> list[Straggler]:
        found, nodes = scores(paces), {p.rank: p.node for p in paces}
        for rank, score in found.items():
            count, since = self._below.get(rank, (0, now))
            self._below[rank] = (count + 1, since if count else now) if score < self.threshold else (0, now)
        return [Straggler(rank, nodes[rank], round(found[rank], 3), since)
                for rank, (count, since) in sorted(self._below.items())
                if count >= self.readings and rank in found]


class Sharing:
    """The thread that shares this rank's median every period and, on rank 0, names stragglers."""

    def __init__(self, store: Any, rank: int, world_size: int, run_dir: str | None, own: OwnTime = OWN) -> None:
        self.store, self.rank, self.world_size, self.own = store, rank, world_size, own
        self.paths = RunPaths(Path(run_dir)) if run_dir else None
        self.node = socket.gethostname().split(".")[0]
        self.period_s = float(os.environ.get(PERIOD_ENV) or PERIOD_S)
        self.watch = Watch(float(os.environ.get(STRAGGLER_SCORE_ENV) or DEFAULT_SCORE))
        self.named: list[Straggler] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slurmkit-stragglers", daemon=True)

    def start(self) -> Sharing:
        if self.world_size > 1 and self.watch.threshold > 0:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self._reading()
            except Exception as exc:  # a store gone with the group: the run goes on unscored
                print(f"slurmkit: straggler scores stopped: {exc}", file=sys.stderr, flush=True)
                return

    def _reading(self) -> None:
        median = self.own.median()
        if median is not None:
            self.store.set(f"slurmkit/pace/{self.rank}", json.dumps([self.node, median]))
        if self.rank != 0:
            return
        paces = []
        for rank in range(self.world_size):
            raw = self.store.peek(f"slurmkit/pace/{rank}")
            if raw is not None:
                node, seconds = json.loads(raw)
                paces.append(Pace(rank, str(node), float(seconds)))
        if len(paces) == self.world_size:
            self._name(self.watch.update(paces, time.time()))

    def _name(self, named: list[Straggler]) -> None:
        if [s.rank for s in named] == [s.rank for s in self.named]:
            return
        new = [s for s in named if s.rank not in {n.rank for n in self.named}]
        self.named = named
        for s in new:
            print(f"slurmkit: straggler: rank {s.rank} on {s.node} scores {s.score:.2f} (the fastest rank: 1.0)",
                  file=sys.stderr, flush=True)
        if self.paths is None:
            return
        Stragglers(named).write(self.paths)
        blame_here(((s.node, "straggler") for s in new), self.paths.run_id)


def sharing(dist: Dist, run_dir: str | None) -> Sharing | None:
    """The sharing thread of a process group slurmkit brought up (its store); None for one rank, or
    a group whose store is torchrun's or the user's."""
    if dist.group is None:
        return None
    return Sharing(dist.group.store, dist.rank, dist.world_size, run_dir).start()
