"""What the job's supervisor watches from outside the ranks while their step runs, where the ranks
cannot speak for themselves.

- A startup hang no rank can report: every rank frozen before its first step (SIGSTOP, a node's
  kernel stuck, a one-rank run that hangs with the GIL held), so no rank's own startup watch
  fires. Rank 0's watch records when it began (common.markers.StartupWatched); GRACE_S past its
  deadline with no first step and no rank's hang marker, the supervisor marks the step hung itself
  (a HangMarker of rank -1, startup) and ends the step: a rank frozen before its first step never
  holds the allocation to its time limit.
- A straggler that lasts: rank 0 names stragglers (common.markers.Stragglers, worker.ft.straggler);
  where the profile's straggler_action is replace, one named for straggler_patience_s is an event
  for the restart policy (policy.StragglerLasted), asked once per node.

- When the standby ranks may start: not beside the ranks' own start, where they would compete for
  the node's CPUs and the filesystem while the ranks import (measured on the dev cluster: a
  requeued rank's imports took 5.5 s with its standby starting beside it, 3.1 s without), but
  once rank 0's first step is done; STANDBY_UNWATCHED_S after the launch where rank 0 keeps no
  startup watch (a plain command), STANDBY_LATEST_S at the latest.

A look reads one or two small files, every LOOK_S at most: one job's supervisor, not every rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slurmkit.common import outcomes
from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import HangMarker, StartupWatched, Straggler, Stragglers

GRACE_S = 15.0
"""Past rank 0's startup deadline: its own watch (a 0.5 s poll, one file) and its peers' would have fired."""
LOOK_S = 5.0
STANDBY_UNWATCHED_S, STANDBY_LATEST_S = 5.0, 120.0


@dataclass
class OutsideWatch:
    paths: RunPaths
    job_id: str
    attempt: int
    launched: float
    """When this step was started: a straggler named before it is an older step's."""
    patience_s: float | None
    """The profile's straggler_patience_s where its straggler_action is replace; None: warn only."""
    _last_look: float = 0.0
    _asked: set[str] = field(default_factory=set)

    def frozen(self, now: float) -> HangMarker | None:
        """The step's startup hang, seen from outside, once it is one (else None)."""
        watched = StartupWatched.read(self.paths, self.job_id, outcomes.restart_count(), self.attempt)
        if watched is None or watched.first_step is not None or HangMarker.any(self.paths):
            return None
        idle = now - watched.begun
        return HangMarker.now(-1, idle, startup=True) if idle > watched.timeout_s + GRACE_S else None

    def lasting(self, now: float) -> Straggler | None:
        """A straggler named for the patience, in this step, whose node was not asked about yet."""
        if self.patience_s is None:
            return None
        for s in Stragglers.read(self.paths):
            if s.since >= self.launched and now - s.since >= self.patience_s and s.node not in self._asked:
                self._asked.add(s.node)
                return s
        return None

    def standby_due(self, now: float) -> bool:
        """Whether the standby ranks may start now (rank 0's first step done, or the fallbacks)."""
        since = now - self.launched
        if since >= STANDBY_LATEST_S:
            return True
        watched = StartupWatched.read(self.paths, self.job_id, outcomes.restart_count(), self.attempt)
        return watched.first_step is not None if watched is not None else since >= STANDBY_UNWATCHED_S

    def due(self, now: float) -> bool:
        """Whether it is time for a look (at most one every LOOK_S)."""
        if now - self._last_look < LOOK_S:
            return False
        self._last_look = now
        return True
