"""How the login side waits on Slurm: every query of a wait or a follow goes through a Poller.

The interval grows with the time already waited: `first_s` at first, then a tenth of the wait so
far, at most `max_s`. Noticing the end of a job costs at most a tenth of its run time (or
`first_s`), and slurmctld sees a bounded rate from each waiting user. With first_s = 1 s: 29
polls in the first minute, 8 in the second, then 4, 3, and 2 a minute (60 / max_s) from the
fifth minute on; 56 in 10 minutes, where a fixed 1 s poll makes 600. A poll is one squeue, plus
one sacct when a job has left squeue. benchmarks/bench_polling.py counts them on real waits.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from slurmkit.errors import warn

DEFAULT_MAX_S = 30.0
FRACTION = 0.1
UNKNOWN_GRACE_S = 120.0
"""How long only jobs that neither squeue nor sacct knows (accounting wiped) are waited for."""

T = TypeVar("T")


@dataclass
class Poller:
    first_s: float = 1.0
    max_s: float = DEFAULT_MAX_S
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    started: float = field(default=-1.0)
    _last_query: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.started < 0:
            self.started = self.clock()

    def elapsed(self) -> float:
        return self.clock() - self.started

    def interval(self) -> float:
        """Seconds between two queries now."""
        return min(self.max_s, max(self.first_s, self.elapsed() * FRACTION))

    def wait(self) -> None:
        """Sleep until the next query is due."""
        self.sleep(self.interval())

    def due(self) -> bool:
        """For loops that wake more often than they query (logs --follow): is a query due now?
        The first call is always due; a True starts the next interval."""
        now = self.clock()
        if self._last_query is not None and now - self._last_query < self.interval():
            return False
        self._last_query = now
        return True

    def until_ended(self, query: Callable[[], T], live: Callable[[T], set[str]],
                    timeout_s: float | None = None, on_answer: Callable[[T], None] | None = None,
                    survive: tuple[type[Exception], ...] = ()) -> T:
        """query() every interval until live(answer), its still-active states, is empty, timeout_s
        has passed, or only UNKNOWN has been live for UNKNOWN_GRACE_S; the last answer. on_answer
        sees every answer (e.g. on_change, to show state transitions). A query that raises one of
        `survive` (a controller down for longer than a query's own retries) is asked again at the
        next interval, with one warning per outage: a long wait outlives a slurmctld restart."""
        unknown_since: float | None = None
        outage = False
        while True:
            try:
                answer = query()
            except survive as exc:
                if timeout_s is not None and self.elapsed() > timeout_s:
                    raise
                if not outage:
                    warn(f"{exc}; still waiting, asking again every {self.interval():.0f} s or more")
                outage = True
                self.wait()
                continue
            outage = False
            if on_answer is not None:
                on_answer(answer)
            now = self.elapsed()
            states = live(answer)
            unknown_since = (unknown_since if unknown_since is not None else now) if states == {"UNKNOWN"} else None
            if (not states or (timeout_s is not None and now > timeout_s)
                    or (unknown_since is not None and now - unknown_since > UNKNOWN_GRACE_S)):
                return answer
            self.wait()


def on_change(describe: Callable[[T], str], emit: Callable[[str], None]) -> Callable[[T], None]:
    """An on_answer that emits describe(answer) whenever it differs from the one before."""
    last: list[str] = []

    def seen(answer: T) -> None:
        text = describe(answer)
        if not last or text != last[0]:
            last[:] = [text]
            emit(text)

    return seen
