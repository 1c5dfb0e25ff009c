"""The experiment trackers a run logs to (profile or spec `tracking:`), from its rank 0 only.

One tracker run per slurmkit run: each incarnation, each in-job and warm restart, finds the same
tracker run again. Its id comes from the slurmkit run id (W&B's run id is the run id; MLflow, which
makes its own ids, finds the run by its `slurmkit/run_id` tag, the oldest such if two incarnations
raced). Logged without user code: the spec's config and resources and the snapshot's git commit as
parameters (once), every metrics record at its step, every restart (cause, kind, lost steps) as an
event at the step training resumed from, and the run's final summary. Steps run again after a
restart: TensorBoard's are overwritten (the writer purges events past the step resumed from);
MLflow keeps both values, the restart event at the resume step marking where the second begins;
W&B keeps the first, dropping any step below the highest it has seen (its own rule).

A tracker that fails, or does not answer in time (an unreachable server), is dropped with one
line on stderr: opening the run's trackers takes at most OPEN_TIMEOUT_S in all, however many they
are (they open side by side; importing MLflow and creating its tables takes seconds on a busy
node), each call after CALL_TIMEOUT_S. A tracker dropped is said once and not tried again by this
process, nor by the user's command it starts (DROPPED_ENV). The lines name no credentials
(config.tracking.redact).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from slurmkit.common.atomic import atomic_write_text
from slurmkit.common.layout import RunPaths
from slurmkit.common.metrics import MetricsWriter, iter_records_reversed, numbers
from slurmkit.common.record import RestartEntry, RunFile
from slurmkit.config.tracking import redact
from slurmkit.jsontypes import JsonObject
from slurmkit.trust import NotOwnError, read_own
from slurmkit.worker import tracker_backends
from slurmkit.worker.process_group import detect
from slurmkit.worker.tracker_backends import Backend, RunInfo

OPEN_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 10.0
DROPPED_ENV = "SLURMKIT_TRACKERS_DROPPED"
"""Trackers the rank's worker dropped (comma-separated names), passed to the user's command: its own
`log` does not try them again."""
T = TypeVar("T")


def bounded_all(calls: dict[str, Callable[[], T]], timeout_s: float) -> dict[str, T | BaseException]:
    """Each call() in a thread of its own, side by side, under one bound for them all: its value, or
    its exception (TimeoutError when it had not returned within `timeout_s`; the thread is left to
    end by itself: a daemon, it never holds the process's exit)."""
    boxes: dict[str, JsonObject] = {name: {} for name in calls}

    def run(name: str) -> None:
        try:
            boxes[name]["value"] = calls[name]()
        except BaseException as exc:  # handed to the caller below
            boxes[name]["error"] = exc

    threads = {name: threading.Thread(target=run, args=(name,), name=f"slurmkit-tracker-{name}", daemon=True)
               for name in calls}
    deadline = time.monotonic() + timeout_s
    for thread in threads.values():
        thread.start()
    for thread in threads.values():
        thread.join(max(0.0, deadline - time.monotonic()))
    got: dict[str, T | BaseException] = {}
    for name, box in boxes.items():
        got[name] = (TimeoutError(f"no answer within {timeout_s:.0f} s") if threads[name].is_alive()
                     else box["error"] if "error" in box else box["value"])
    return got


def bounded(call: Callable[[], T], timeout_s: float) -> T:
    """call() in a thread of its own; TimeoutError when it has not returned within `timeout_s`."""
    (got,) = bounded_all({"call": call}, timeout_s).values()
    if isinstance(got, BaseException):
        raise got
    return got


_dropped: dict[str, dict[str, str]] = {}
"""Trackers this process dropped, by run folder, then by name, with the error's type: never opened
again here for that run."""


def dropped_here(run_dir: str | Path) -> dict[str, str]:
    """The run's trackers this process dropped, with what the rank's worker passed on (DROPPED_ENV)."""
    inherited = {n: "inherited" for n in os.environ.get(DROPPED_ENV, "").split(",") if n}
    return {**inherited, **_dropped.get(str(Path(run_dir)), {})}


def remember(run_dir: str | Path, name: str, exc: BaseException) -> None:
    """The run's tracker `name` is never tried again in this process (the first error's type kept)."""
    _dropped.setdefault(str(Path(run_dir)), {}).setdefault(name, type(exc).__name__)


def drop(run_dir: str | Path, name: str, exc: BaseException) -> None:
    """Say once that the run's tracker `name` is left out, and never try it again in this process."""
    if name not in dropped_here(run_dir):
        say(f"{name} left out", exc)
    remember(run_dir, name, exc)


def say(what: str, exc: BaseException) -> None:
    print(redact(f"slurmkit: tracking: {what}: {type(exc).__name__}: {exc}"), file=sys.stderr, flush=True)


@dataclass
class Trackers:
    """The run's backends, fanned out. Restarts are read from run.json when it changes."""

    info: RunInfo
    backends: list[Backend]
    resumed_from: int = 0
    last_step: int = 0
    _seen_restarts: int = 0
    _record_mtime: float = -1.0
    dropped: dict[str, str] = field(default_factory=dict)
    """Each backend left out, and the error's type that did it (TimeoutError: it did not answer)."""

    @classmethod
    def open(cls, run_dir: str | Path, resumed_from: int | None = None) -> Trackers | None:
        """The run's trackers, or None when it names none (or has no run.json, as in a bare test)."""
        paths = RunPaths(Path(run_dir))
        if not paths.record.exists():
            return None
        info = RunInfo.of(paths, RunFile(paths).read())
        if info is None:
            return None
        named = dict(tracker_backends.for_run(info, resumed_from or 0))
        makes = {name: make for name, make in named.items() if name not in dropped_here(paths.run_dir)}
        made: list[Backend] = []
        for name, got in bounded_all(makes, OPEN_TIMEOUT_S).items():
            if isinstance(got, Exception):  # a missing package, an unreachable server: said once, then left out
                drop(paths.run_dir, name, got)
            elif isinstance(got, BaseException):
                raise got
            else:
                made.append(got)
        dropped = {n: e for n, e in dropped_here(paths.run_dir).items() if n in named}
        opened = cls(info, made, resumed_from or 0, resumed_from or 0, _told(paths), dropped=dropped)
        opened.sync_restarts()
        return opened

    def _each(self, what: str, call: Callable[[Backend], None]) -> None:
        for backend in list(self.backends):
            try:
                bounded(functools.partial(call, backend), CALL_TIMEOUT_S)
            except Exception as exc:
                say(f"{backend.name} {what} failed, left out from here", exc)
                self.backends.remove(backend)
                self.dropped[backend.name] = type(exc).__name__
                remember(self.info.paths.run_dir, backend.name, exc)

    def record(self, record: JsonObject) -> None:
        """A metrics record (MetricsWriter's sink)."""
        if "step" in record:
            self.log(numbers(record), int(record["step"]))
        self.sync_restarts()

    def log(self, values: dict[str, float], step: int) -> None:
        self.last_step = max(self.last_step, step)
        self._each("log", lambda b: b.metrics(step, values))

    def sync_restarts(self) -> None:
        """Each restart run.json holds that no backend was told of yet, as an event."""
        try:
            mtime = self.info.paths.record.stat().st_mtime
            if mtime == self._record_mtime:
                return
            self._record_mtime = mtime
            restarts = RunFile(self.info.paths).read().restarts
            if len(restarts) <= self._seen_restarts:
                return
            for entry in restarts[self._seen_restarts:]:
                step = entry.resumed_step if entry.resumed_step is not None else (entry.step or self.resumed_from)
                self._each("event", _event(step, entry))
            self._seen_restarts = len(restarts)
            # The next incarnation tells the trackers only of restarts after these.
            atomic_write_text(self.info.paths.tracking_state, json.dumps({"restarts_told": self._seen_restarts}))
        except Exception as exc:  # run.json mid-edit elsewhere, a full disk: the next record tries again
            say("restarts not read", exc)

    def finish(self, summary: JsonObject) -> None:
        """The run's end: its summary's numbers, and the tracker run closed as finished."""
        self._each("finish", lambda b: b.finish(self.last_step, numbers(summary)))

    def close(self) -> None:
        self._each("close", lambda b: b.close())


def _event(step: int, entry: RestartEntry) -> Callable[[Backend], None]:
    return lambda backend: backend.event(step, entry)


def _told(paths: RunPaths) -> int:
    """Restarts an earlier incarnation told the trackers of."""
    try:
        return int(json.loads(read_own(paths.tracking_state, 4096))["restarts_told"])
    except NotOwnError as exc:  # not acted on: the events again, rather than none
        say("restarts told", exc)
        return 0
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or torn
        return 0


_active: Trackers | None = None
_opened = False


_logged: MetricsWriter | None = None


def activate(trackers: Trackers | None) -> None:
    """The trackers `log` uses in this process (the train task's own, so both log to one writer)."""
    global _active, _opened
    _active, _opened = trackers, True


def log(metrics: dict[str, float], step: int) -> None:
    """Log `metrics` at `step` from a user's function or command (or a framework's callback):
    written to the run's logged.jsonl, which `sweep results` and `report` read, and to the run's
    tracker backends. A no-op on every rank but 0 and outside a slurmkit run."""
    global _active, _opened, _logged
    if detect().rank != 0:
        return
    run_dir = os.environ.get("SLURMKIT_RUN_DIR")
    if not _opened:
        _opened = True
        _active = Trackers.open(run_dir) if run_dir else None
    values = {k: float(v) for k, v in metrics.items()}
    if run_dir and _logged is None:
        _logged = MetricsWriter(RunPaths(Path(run_dir)).logged, True)
    if _logged is not None:
        _logged.write({"step": int(step), **values})
    if _active is not None:
        _active.log(values, int(step))


def environment(run_dir: str, rank: int) -> dict[str, str]:
    """The variables with which a user's function or command logs to the run's tracker runs through
    the trackers' own API: W&B's run id, project, group, folder and mode (a bare `wandb.init()` then
    resumes the run's W&B run); MLflow's tracking URI and experiment, and on rank 0 the run's MLflow
    run id, found or made here (a bare `mlflow.start_run()` then goes on with it)."""
    paths = RunPaths(Path(run_dir))
    info = RunInfo.of(paths, RunFile(paths).read()) if paths.record.exists() else None
    if info is None:
        return {}
    t, env = info.tracking, dict[str, str]()
    if t.wandb:
        env.update(WANDB_RUN_ID=info.run_id, WANDB_RESUME="allow", WANDB_PROJECT=info.project, WANDB_NAME=info.name,
                   WANDB_DIR=str(paths.tracking_dir), WANDB_MODE=t.wandb)
        env.update({"WANDB_RUN_GROUP": info.sweep_id} if info.sweep_id else {})
        env.update({"WANDB_ENTITY": t.wandb_entity} if t.wandb_entity else {})
    if t.mlflow:
        env.update(MLFLOW_TRACKING_URI=t.mlflow, MLFLOW_EXPERIMENT_NAME=info.project)
        if rank == 0 and "mlflow" not in dropped_here(run_dir):
            try:
                mlflow_uri = t.mlflow
                env["MLFLOW_RUN_ID"] = bounded(lambda: tracker_backends.Mlflow(info, mlflow_uri), OPEN_TIMEOUT_S).run_id
            except Exception as exc:  # said once, and the user's code makes its own run
                drop(run_dir, "mlflow", exc)
    if gone := dropped_here(run_dir):
        env[DROPPED_ENV] = ",".join(sorted(gone))
    return env


def _finish(run_dir: str, log: Path, summary: JsonObject) -> bool:
    """The run's tracker runs closed as finished with `summary`; False when it names no tracker."""
    last = next((int(r["step"]) for r in iter_records_reversed(log) if "step" in r), 0)
    opened = Trackers.open(run_dir, resumed_from=last)  # as a resumed incarnation: nothing purged
    if opened is None:
        return False
    opened.finish(summary)
    opened.close()
    return True


def finish_run(run_dir: str) -> None:
    """A function's or command's run ended well: its tracker runs end FINISHED (a user's script
    that logged with `log` leaves them running; a train task's Trainer finishes its own)."""
    _finish(run_dir, RunPaths(Path(run_dir)).logged, {})


def send_accounting(run_dir: str, values: dict[str, float]) -> bool:
    """An ended run's goodput accounting (computed by `slurmkit track` on the login node, from
    sacct) to its trackers, as their end-of-run numbers; False when the run names no tracker."""
    summary = {(k if k.startswith("goodput") else f"goodput_{k}"): v for k, v in values.items()}
    return _finish(run_dir, RunPaths(Path(run_dir)).metrics, summary)


def main(argv: list[str] | None = None) -> int:
    """python -P -m slurmkit.worker.tracking RUN_DIR ACCOUNTING_JSON (run by runs.track with the
    ranks' interpreter, which has the trackers' packages): exit 3 when the run names no tracker."""
    run_dir, payload = (argv if argv is not None else sys.argv[1:])[:2]
    return 0 if send_accounting(run_dir, json.loads(payload)) else 3


if __name__ == "__main__":
    sys.exit(main())
