"""Stragglers: each rank times its own work; about every PERIOD_S the ranks share their medians on
the run's store, from a thread that never blocks training; rank 0 scores them and names a slow rank.

- Own work: for the Trainer, its forward passes and its optimizer step, never the wait in the
  gradient all-reduce (a fast rank waits there for the slow one); for a slurmkit.Checkpoint and
  the Lightning and HF callbacks, the time between step boundaries less what their own stop vote
  waited.
- Shared: on the run's store by a thread (Sharing), or, for the framework callbacks, over their
  stop vote's gloo group (GroupPaces).
- Score: the fastest rank's median divided by this rank's, so 1.0 is the fastest.
- Named: a rank below the profile's straggler_score (SLURMKIT_STRAGGLER_SCORE; 0.7; 0: off) for
  READINGS readings in a row. Rank 0 says so in its log, writes the run's stragglers.json
  (common.markers.Stragglers: `slurmkit status` shows it) and blames its node in the user's node
  ledger; a rank back above the score is no longer named. stragglers.json is emptied when the
  sharing starts: it names the ranks of this step, not an older one's.
- Over time: each reading's median score and its SLOWEST lowest-scoring ranks go to the run's
  scores.jsonl (the report draws them), and the lowest score into rank 0's metrics records
  (`straggler_score_min`, so every tracker gets it): the scores of a thousand-node run every 10 s
  are a few ranks a line, not every rank.
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
from typing import TYPE_CHECKING, Any

from slurmkit import trust
from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import Straggler, Stragglers
from slurmkit.common.node_ledger import blame_here
from slurmkit.common.slurm_env import STRAGGLER_SCORE_ENV
from slurmkit.jsontypes import JsonObject

if TYPE_CHECKING:  # the process group imports torch; the stop vote that uses this module may run without it
    from slurmkit.worker.process_group import Dist

PERIOD_ENV = "SLURMKIT_STRAGGLER_PERIOD_S"
DEFAULT_SCORE, PERIOD_S, READINGS, KEEP, SLOWEST = 0.7, 10.0, 3, 64, 8


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


class DdpOwnTime:
    """A framework step's own work where torch's DDP all-reduces the gradients inside it (Lightning's
    "ddp"): from the batch's start to its last gradient bucket ready (a comm hook, timed around
    DDP's own all-reduce hook), plus from the end of backward to the step's end. A fast rank's wait
    for the slow one in the all-reduce falls between the two, so it does not count."""

    def __init__(self, own: OwnTime = OWN) -> None:
        self.own = own
        self._start = self._ready = self._after = 0.0

    def install(self, model: object) -> bool:
        """Time `model`'s buckets, where it is torch's DistributedDataParallel without a comm hook of
        its own (a second hook is refused by DDP: then boundary timing stays)."""
        import torch.distributed as tdist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(model, DistributedDataParallel) or not tdist.is_initialized():
            return False

        def timed(group: Any, bucket: Any) -> Any:
            self._ready = time.perf_counter()
            return default_hooks.allreduce_hook(group, bucket)

        timed.__annotations__ = {}  # DDP checks them, and this module's are strings (PEP 563)
        try:
            model.register_comm_hook(model.process_group, timed)
        except RuntimeError:
            return False
        return True

    def batch_start(self) -> None:
        self._start = self._ready = time.perf_counter()

    def after_backward(self) -> None:
        self._after = time.perf_counter()

    def batch_end(self) -> None:
        if self._start and self._after:
            self.own.add(self._ready - self._start + time.perf_counter() - self._after)
        self._start = self._after = 0.0


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


class Namer:
    """Rank 0's side: each reading scored, kept over time and the stragglers named."""

    def __init__(self, run_dir: str | None) -> None:
        self.paths = RunPaths(Path(run_dir)) if run_dir else None
        self.watch = Watch(threshold())
        self.named: list[Straggler] = []
        self.lowest: float | None = None
        """The lowest score at the last reading."""

    def begin(self) -> None:
        """The sharing starts: stragglers.json names this step's ranks, not an older one's."""
        if self.paths is not None:
            Stragglers([]).write(self.paths)

    def reading(self, paces: list[Pace], now: float) -> None:
        self._keep(scores(paces), now)
        self._name(self.watch.update(paces, now))

    def hook(self, trainer: object, record: JsonObject) -> None:
        """Trainer hook: the lowest score of the last reading, in the metrics record."""
        if self.lowest is not None:
            record["straggler_score_min"] = self.lowest

    def _keep(self, found: dict[int, float], now: float) -> None:
        """This reading, over time: its lowest score, and a line of scores.jsonl."""
        self.lowest = round(min(found.values()), 3)
        if self.paths is None:
            return
        slowest = sorted(found.items(), key=lambda kv: (kv[1], kv[0]))[:SLOWEST]
        line = {"time": round(now, 3), "median": round(statistics.median(found.values()), 3),
                "slowest": [[rank, round(score, 3)] for rank, score in slowest]}
        fd = trust.open_append(self.paths.straggler_scores, 0o600)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)

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


def threshold() -> float:
    """The profile's straggler_score, as this rank got it (0: scoring off)."""
    return float(os.environ.get(STRAGGLER_SCORE_ENV) or DEFAULT_SCORE)


def node_name() -> str:
    return socket.gethostname().split(".")[0]


class Sharing:
    """The thread that shares this rank's median every period on the run's store and, on rank 0,
    names stragglers (Namer)."""

    def __init__(self, store: Any, rank: int, world_size: int, run_dir: str | None, own: OwnTime = OWN) -> None:
        self.store, self.rank, self.world_size, self.own = store, rank, world_size, own
        self.namer = Namer(run_dir) if rank == 0 else None
        self.node = node_name()
        self.period_s = float(os.environ.get(PERIOD_ENV) or PERIOD_S)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slurmkit-stragglers", daemon=True)

    def start(self) -> Sharing:
        if self.world_size > 1 and threshold() > 0:
            if self.namer is not None:
                self.namer.begin()
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
        if self.namer is None:
            return
        paces = []
        for rank in range(self.world_size):
            raw = self.store.peek(f"slurmkit/pace/{rank}")
            if raw is not None:
                node, seconds = json.loads(raw)
                paces.append(Pace(rank, str(node), float(seconds)))
        if len(paces) == self.world_size:
            self.namer.reading(paces, time.time())


class GroupPaces:
    """The same readings for a framework's callbacks (Lightning's, the HF Trainer's), whose process
    group is the framework's and has no slurmkit store: the ranks' medians are all-gathered over the
    stop vote's own gloo group (ft.stop.LaggedVote), asynchronously, at a vote boundary every rank
    agreed on in the vote itself (`due`: some rank's period had passed), and read at the next one.
    No step waits on it; rank 0 names stragglers from them (Namer)."""

    def __init__(self, rank: int, world_size: int, run_dir: str | None, own: OwnTime = OWN) -> None:
        self.rank, self.world_size, self.own = rank, world_size, own
        self.on = world_size > 1 and threshold() > 0
        self.namer = Namer(run_dir) if rank == 0 and self.on else None
        self.period_s = float(os.environ.get(PERIOD_ENV) or PERIOD_S)
        self._last = time.monotonic()
        self._nodes: list[str] = []
        self._pending: tuple[Any, list[Any]] | None = None

    def due(self) -> int:
        """This rank's part of the vote: 1 once its period has passed since the last exchange."""
        return int(self.on and time.monotonic() - self._last >= self.period_s)

    def exchange(self, group: Any) -> None:
        """At the boundary the ranks agreed on (every rank calls it there): the last exchange read,
        the next one started."""
        import torch
        import torch.distributed as tdist

        self._last = time.monotonic()
        if not self._nodes:  # once: which node each rank is on
            nodes: list[Any] = [None] * self.world_size
            tdist.all_gather_object(nodes, node_name(), group=group)
            self._nodes = [str(n) for n in nodes]
            if self.namer is not None:
                self.namer.begin()
        self.read()
        median = self.own.median()
        mine = torch.tensor([median if median is not None else -1.0], dtype=torch.float64)
        out = [torch.zeros(1, dtype=torch.float64) for _ in range(self.world_size)]
        self._pending = (tdist.all_gather(out, mine, group=group, async_op=True), out)

    def read(self) -> None:
        """The exchange in flight, waited for (it has had a period to finish) and, on rank 0, scored."""
        if self._pending is None:
            return
        work, out = self._pending
        self._pending = None
        work.wait()
        medians = [float(t[0]) for t in out]
        if self.namer is not None and all(m > 0 for m in medians):
            self.namer.reading([Pace(r, self._nodes[r], m) for r, m in enumerate(medians)], time.time())


def sharing(dist: Dist, run_dir: str | None) -> Sharing | None:
    """The sharing thread of a process group slurmkit brought up (its store); None for one rank, or
    a group whose store is torchrun's or the user's."""
    if dist.group is None:
        return None
    return Sharing(dist.group.store, dist.rank, dist.world_size, run_dir).start()
