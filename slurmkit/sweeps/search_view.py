"""A search sweep as the login side sees it: its driver and trials (SearchState), followed until
the driver ends (`sweep --wait`, SearchHandle.wait), resumed (`sweep resume`) or stopped (`sweep
cancel`). The driver itself is sweeps.search."""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from slurmkit.common.sweep_layout import DriverFile, DriverRecord, Manifest, SweepPaths
from slurmkit.errors import ConfigError, SlurmkitError
from slurmkit.jsontypes import JsonObject
from slurmkit.runs.polling import Poller
from slurmkit.runs.procs import same_process, signal_process
from slurmkit.sweeps import study
from slurmkit.sweeps.search import driver_alive, start_driver
from slurmkit.sweeps.store import check_task_secrets

ENDED = (study.COMPLETE, study.PRUNED, study.FAIL)
STOP_WAIT_S = 120.0  # an sbatch in flight has its own timeout (60 s) and retries


@dataclass(frozen=True)
class SearchState:
    """Where a search stands: its driver, its trials and the best of them."""

    driver: str
    """running, done, stopped, failed; or dead: its record says running but its process is gone
    (the login node rebooted): `slurmkit sweep resume` starts another."""
    detail: str
    budget: int
    metric: str
    mode: str
    trials: list[study.Trial]
    best: study.Trial | None

    @property
    def ended(self) -> int:
        return sum(t.state in ENDED for t in self.trials)

    def line(self) -> str:
        """One line for people: how far, and the best so far."""
        by = {s: sum(t.state == s for t in self.trials) for s in (study.PRUNED, study.FAIL)}
        extra = ", ".join(f"{n} {s.lower()}" for s, n in by.items() if n)
        best = (f"best {self.metric} {self.best.value:g} (trial {self.best.number}: {_params(self.best.params)})"
                if self.best is not None and self.best.value is not None else f"no {self.metric} yet")
        return (f"{self.ended}/{self.budget} trials ended" + (f" ({extra})" if extra else "") + f"; {best}; "
                f"driver {self.driver}" + (f": {self.detail}" if self.detail else ""))

    def as_dict(self) -> JsonObject:
        return {"driver": self.driver, "detail": self.detail, "budget": self.budget, "metric": self.metric,
                "mode": self.mode, "ended": self.ended, "best": self.best.as_dict() if self.best else None,
                "trials": [t.as_dict() for t in self.trials]}


def _params(params: Mapping[str, object]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def search_state(paths: SweepPaths) -> SearchState:
    manifest = Manifest(paths).read()
    search = manifest.search
    if search is None:
        raise ConfigError("not a search sweep", where=paths.sweep_id, valid="valid: a sweep whose spec has search:")
    driver: str
    try:
        record = DriverFile(paths).read()
        driver, detail = record.state, record.detail
        if driver == "running" and not driver_alive(record):
            driver = "dead"
    except SlurmkitError:
        driver, detail = "dead", "no driver record"
    found = study.read_trials(paths)
    # Failed trials enqueued again (`resubmit --failed`) are trials of the budget too.
    return SearchState(driver, detail, max(search.trials, len(found)), search.metric, search.mode, found,
                       study.best(found, search.mode))


def follow(paths: SweepPaths, on_change: Callable[[SearchState], None] | None = None, timeout_s: float | None = None,
           poller: Poller | None = None) -> SearchState:
    """Poll (backing off, as every wait does) until the driver is no longer running; `on_change`
    sees the state first and each time more trials have ended (the best so far). The last state."""
    last: list[int] = []

    def seen(st: SearchState) -> None:
        if on_change is not None and (not last or st.ended != last[0]):
            on_change(st)
        last[:] = [st.ended]

    return (poller or Poller(first_s=2.0)).until_ended(
        lambda: search_state(paths), lambda st: {st.driver} if st.driver == "running" else set(), timeout_s, seen)


def resume(paths: SweepPaths, force: bool = False) -> int | None:
    """Start a driver for the search unless one runs; its pid (None: one was running here). A
    driver recorded as running on another login node is refused, but with `force` (that node is
    gone): only its own host can see whether its process lives, and two drivers would ask twice.
    A grid sweep has no driver to start: one line. The search's secret_env is checked as at submit."""
    manifest = Manifest(paths).read()
    if manifest.search is None:
        raise ConfigError("not a search sweep: it has no driver to resume", where=paths.sweep_id,
                          valid="valid: `slurmkit sweep resubmit --failed` for a grid sweep's failed tasks")
    check_task_secrets(manifest, [])
    try:
        record: DriverRecord | None = DriverFile(paths).read()
    except SlurmkitError:
        record = None
    if record is not None and driver_alive(record):
        if record.host == socket.gethostname():
            return None
        if not force:
            raise SlurmkitError(f"its driver's record says it runs on {record.host} (pid {record.pid}), which only "
                                "that host can check", where=paths.sweep_id,
                                valid=f"valid: `slurmkit sweep resume` on {record.host}, or --force here if "
                                      f"{record.host} is gone")
    return start_driver(paths)


def retry_failed(paths: SweepPaths) -> list[int]:
    """`sweep resubmit --failed` of a search: each failed trial enqueued again as a new trial (the
    study's FAIL stays as it was told), and a driver started to run them unless one runs. The
    failed trials' numbers."""
    manifest = Manifest(paths).read()
    assert manifest.search is not None
    check_task_secrets(manifest, [])  # before the study is changed: nothing enqueued that cannot run
    failed = study.retry_failed(study.open_study(paths, manifest.search, manifest.prune))
    if failed:
        resume(paths)
    return failed


def stop_driver(paths: SweepPaths) -> bool:
    """SIGTERM to the search's driver, then wait until it has exited (it stops between two of its
    steps, never with an sbatch unrecorded); False where none runs here."""
    try:
        record = DriverFile(paths).read()
    except SlurmkitError:
        return False
    if record.state != "running" or not signal_process(record.pid, record.start, signal.SIGTERM):
        return False
    poller = Poller(first_s=0.2, max_s=1.0)
    while same_process(record.pid, record.start) and poller.elapsed() < STOP_WAIT_S:
        poller.wait()
    return True
