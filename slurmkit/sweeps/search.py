"""A search sweep's driver: Optuna's ask and tell over job arrays (docs/sweeps.md, "Search").

Each round the driver tells the study what every ended trial gave, then, once the batch in flight
has ended, asks the next `batch` trials, adds them to the manifest as tasks (task i is trial i)
and submits them as one job array. While a batch runs it reads each running trial's intermediate
values and asks the pruner; a trial it prunes gets the PruneRequest marker and the profile's
signal, so its ranks stop at a step boundary and the job's decider ends it there.

The driver is a detached process on the login node, started by `slurmkit sweep` (and by
`slurmkit.sweep`): closing the SSH session leaves it running. Its state is the study, the manifest
and the array log, each written before the step it records is taken, so a driver killed anywhere
(the login node rebooted) loses no trial and runs none twice: `slurmkit sweep resume SWEEP` starts
another, which first tells the ended trials, submits trials that were added but never reached
sbatch (or were asked of the study and never added), and goes on. One driver at a time: it holds
the sweep's driver lock for its life.

    python -P -m slurmkit.sweeps.search --sweep-dir DIR
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from slurmkit import trust
from slurmkit.common.locked import try_lock
from slurmkit.common.markers import PruneRequest
from slurmkit.common.metrics import is_number, iter_records
from slurmkit.common.sweep_layout import DriverFile, DriverRecord, Manifest, ManifestTask, SweepManifest, SweepPaths
from slurmkit.config.runspec import RunSpec
from slurmkit.config.search import SearchSection
from slurmkit.config.train import TrainConfig
from slurmkit.errors import PreflightError, SlurmkitError
from slurmkit.jsontypes import JsonObject
from slurmkit.load.overrides import deep_merge, nested
from slurmkit.runs.jobs.status import is_active
from slurmkit.runs.polling import DEFAULT_MAX_S, Poller
from slurmkit.runs.procs import same_process, start_time
from slurmkit.slurm import commands
from slurmkit.slurm.commands import TransientSlurmError
from slurmkit.sweeps import arrays, local, study
from slurmkit.sweeps.plan import compress
from slurmkit.sweeps.results import TaskState, final_metrics, task_states
from slurmkit.sweeps.spec import SweepPlan
from slurmkit.sweeps.store import manifest_tasks


class DriverBusy(SlurmkitError):
    """Another driver holds the sweep's driver lock."""


@contextlib.contextmanager
def driver_lock(paths: SweepPaths) -> Iterator[None]:
    """The sweep's one driver: an exclusive lock held for the driver's life (the kernel drops it
    when the process dies, however it dies)."""
    try:
        fd = try_lock(paths.driver_lock)
    except BlockingIOError:
        raise DriverBusy("a driver already runs this search", where=paths.sweep_id,
                         valid="valid: `slurmkit sweep status SWEEP` to follow it") from None
    try:
        yield
    finally:
        os.close(fd)


def driver_alive(record: DriverRecord) -> bool:
    """The recorded driver runs (one on another host is taken as alive while its record says
    running: only its own host can tell)."""
    if record.state != "running":
        return False
    return record.host != socket.gethostname() or same_process(record.pid, record.start)


def _record_running(driver: DriverFile, pid: int) -> None:
    """driver.json names `pid` on this host as the running driver; the pruner's verdicts of a
    driver before it stay."""
    me = {"pid": pid, "start": start_time(pid), "host": socket.gethostname(), "state": "running", "detail": ""}
    if not driver.create(DriverRecord(**me)):
        driver.update(**me)


def start_driver(paths: SweepPaths) -> int:
    """The driver, detached in its own session (SIGHUP of a closed SSH session never reaches it)."""
    out = os.fdopen(trust.open_append(paths.driver_log, 0o600), "a")
    proc = subprocess.Popen([sys.executable, "-P", "-m", "slurmkit.sweeps.search", "--sweep-dir", str(paths.sweep_dir)],
                            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    out.close()
    _record_running(DriverFile(paths), proc.pid)  # here too: who follows the search at once finds it running
    return proc.pid


# -- submit: the base, the first batch, the driver ---------------------------------------------------
def preview(plan: SweepPlan) -> JsonObject:
    """What submit would start (--dry-run): the search, its arrays' count; no trial is asked."""
    search = plan.section.search
    assert search is not None
    return {"sweep_id": None, "tasks": search.trials, "varying": plan.varying,
            "arrays": math.ceil(search.trials / search.batch), "search": search.model_dump(),
            "prune": plan.section.prune.model_dump() if plan.section.prune else None}


def begin(paths: SweepPaths, search: SearchSection, after: str | None) -> list[str]:
    """The first batch asked and submitted here (sbatch's refusal is the submit's own error), then
    the driver started for the rest; the first array's ids."""
    manifest = Manifest(paths).read()
    if manifest.executor == "slurm" and search.batch > (limit := arrays.cluster_limits()[0]):
        raise PreflightError(f"a batch of {search.batch} trials is over the cluster's MaxArraySize={limit}",
                             where=f"{manifest.source}:sweep.search.batch", valid=f"valid: at most {limit}")
    opened = study.open_study(paths, search, manifest.prune)
    manifest = ask_batch(paths, manifest, opened)
    todo = never_submitted(manifest)  # all of the batch but trials the spec refused
    ids = submit_tasks(paths, manifest, todo, after) if todo else []
    start_driver(paths)
    return ids


# -- one batch ------------------------------------------------------------------------------------
def _task(manifest: SweepManifest, number: int, params: JsonObject) -> ManifestTask:
    """Trial `number` as a task: its params over the base spec, validated as the task will read it.
    Params the spec refuses (a combination the submit's one-at-a-time check could not see) make a
    task that is never run: FAILED, and the study told so, while the search goes on."""
    merged = deep_merge(deep_merge(manifest.base_spec or {}, nested(params)), manifest.top)
    try:
        spec = RunSpec.model_validate(merged)
        seed = TrainConfig.model_validate(spec.config).seed if spec.task == "train" else manifest.seed + number
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        why = f"{field}: {err['msg']}" if field else err["msg"]
        print(f"trial {number} {params}: refused by the spec ({why}); told to the study as FAIL", flush=True)
        return ManifestTask(index=number, overrides=dict(params), seed=manifest.seed + number, invalid=why)
    return ManifestTask(index=number, overrides=dict(params), seed=seed)


PROGRESS_S = 2.0
"""How often a batch's asking says how far it is."""


def ask_batch(paths: SweepPaths, manifest: SweepManifest, opened: Any) -> SweepManifest:
    """The next trials asked and added as tasks (not yet submitted)."""
    search = manifest.search
    assert search is not None
    left = study.budget(opened, search) - len(manifest.tasks)
    opened.sampler = study.sampler(search, len(manifest.tasks))
    dists = study.distributions(search)
    want = min(search.batch, left)
    asked, said = [], time.monotonic()
    for _ in range(want):
        asked.append(opened.ask(dists))
        if time.monotonic() - said > PROGRESS_S:  # a large batch takes minutes to ask: say how far
            print(f"asked {len(asked)}/{want} trials of this batch", file=sys.stderr, flush=True)
            said = time.monotonic()
    return Manifest(paths).add_tasks([_task(manifest, t.number, t.params) for t in asked])


def adopt_asked(paths: SweepPaths, manifest: SweepManifest, opened: Any) -> SweepManifest:
    """Trials the study holds as asked (RUNNING) that no task holds: a driver died between its ask
    and the manifest's write. They become the tasks they were asked as, with the params asked."""
    running = study.optuna_module().trial.TrialState.RUNNING
    asked = sorted((t for t in opened.get_trials(deepcopy=False, states=(running,))
                    if t.number >= len(manifest.tasks)), key=lambda t: t.number)
    if not asked:
        return manifest
    return Manifest(paths).add_tasks([_task(manifest, t.number, t.params) for t in asked])


def submit_tasks(paths: SweepPaths, manifest: SweepManifest, indices: list[int], after: str | None = None) -> list[str]:
    """One job array of `indices` (one local runner on the local profile); the array ids."""
    if manifest.executor == "local":
        local.start(paths, indices)
        return []
    groups, _ = manifest_tasks(manifest)
    spec = compress([i - indices[0] for i in indices]) + (f"%{manifest.max_parallel}" if manifest.max_parallel else "")
    planned = [{"indices": indices, "base": indices[0], "array": spec, "job_id": None, "group": 0}]
    return arrays.submit_arrays(paths, groups, planned, "initial", after, None)


def _recover(paths: SweepPaths, manifest: SweepManifest) -> None:
    """A driver before this one killed while it submitted: its array adopted, or submitted again
    (sweeps.arrays.recover); its local runner started (sweeps.local.recover)."""
    if manifest.executor == "local":
        local.recover(paths)
    else:
        arrays.recover(paths, lambda indices: submit_tasks(paths, Manifest(paths).read(), indices))


def never_submitted(manifest: SweepManifest) -> list[int]:
    """Tasks that no array entry holds: added by a driver that died before it reached sbatch (an
    entry is written before sbatch runs, so these were never queued)."""
    held = {i for arr in manifest.arrays for i in arr.indices}
    return [t.index for t in manifest.tasks if t.index not in held and t.invalid is None]


# -- telling and pruning --------------------------------------------------------------------------
def finite(value: Any) -> float | None:
    """A number the study can take (not a bool, NaN or infinity), as a float."""
    return float(value) if is_number(value) and math.isfinite(value) else None


def metric_value(paths: SweepPaths, state: TaskState, metric: str) -> float | None:
    return finite(final_metrics(paths, state.index, state.job_id, bare=metric).get(metric))


def tell_ended(paths: SweepPaths, opened: Any, states: list[TaskState], metric: str, pruned: dict[str, int]) -> int:
    """Tell the study each ended trial it still holds as running; how many were told."""
    ts = study.optuna_module().trial.TrialState
    running = {t.number for t in opened.get_trials(deepcopy=False, states=(ts.RUNNING,))}
    told = 0
    for st in states:
        if st.index not in running or is_active(st.state):
            continue
        value = metric_value(paths, st, metric) if st.state == "COMPLETED" else None
        if str(st.index) in pruned:
            study.tell(opened, st.index, state=ts.PRUNED)
        elif value is not None:
            study.tell(opened, st.index, value)
        else:  # failed, cancelled, never submitted, or ended without the metric: never stalls the study
            study.tell(opened, st.index, state=ts.FAIL)
        told += 1
    return told


def intermediate(paths: SweepPaths, index: int, metric: str) -> dict[int, float]:
    """The trial's reported values of `metric` by step: its metrics file's (the Trainer's loss) and
    what it logged with slurmkit.tracking.log; a step in both keeps the logged value."""
    task = paths.task(index)
    found: dict[int, float] = {}
    for path in (task.metrics, task.logged):
        for rec in iter_records(path):
            step, value = rec.get("step"), finite(rec.get(metric))
            if isinstance(step, int) and value is not None:
                found[step] = value
    return found


def prune_running(paths: SweepPaths, manifest: SweepManifest, opened: Any, states: list[TaskState],
                  driver: DriverFile, already: dict[str, int]) -> list[int]:
    """Report each running trial's new values to the study and stop those the pruner picks (not
    those `already` pruned); the ones stopped now."""
    assert manifest.search is not None
    optuna = study.optuna_module()
    frozen = {t.number: t for t in opened.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))}
    pruned_now = []
    for st in states:
        trial = frozen.get(st.index)
        if trial is None or st.state != "RUNNING" or not st.job_id or str(st.index) in already:
            continue
        reported = dict(trial.intermediate_values)
        live = optuna.trial.Trial(opened, trial._trial_id)
        for step, value in sorted(intermediate(paths, st.index, manifest.search.metric).items()):
            if step not in reported:
                live.report(value, step)
                reported[step] = value
        if reported and live.should_prune():
            step = max(reported)
            stop(paths, manifest, st, driver, PruneRequest(step, reported[step], _now()))
            pruned_now.append(st.index)
    return pruned_now


def stop(paths: SweepPaths, manifest: SweepManifest, st: TaskState, driver: DriverFile, request: PruneRequest) -> None:
    """The pruner's verdict, recorded before it is acted on: the marker the job's decider reads, the
    driver's record, then the profile's signal (the ranks' agreed stop)."""
    request.write(paths.task(st.index))
    with driver.editing() as rec:
        rec.pruned[str(st.index)] = request.step
    commands.scancel([st.job_id], signal=str(manifest.profile["signal"]))  # a dumped profile names every field
    print(f"trial {st.index}: pruned at step {request.step} ({request.value:g})", flush=True)


def _now() -> str:
    return dt.datetime.now().isoformat(timespec="seconds")


# -- the loop ---------------------------------------------------------------------------------------
class DriverStopped(Exception):
    """SIGTERM (`sweep cancel`) was noted; the driver stops between two of its steps."""


STOP = threading.Event()
"""Set by the driver's SIGTERM handler (which does nothing else); read at the top of each round,
and its wait is the poller's sleep, so a stop ends the wait at once but never an sbatch half-recorded."""


def _sleep(seconds: float) -> None:
    STOP.wait(seconds)


def drive(paths: SweepPaths, poller: Poller | None = None) -> None:
    """Run the search to its end (see the module's docstring); the caller holds no lock."""
    with driver_lock(paths):
        driver = DriverFile(paths)
        _record_running(driver, os.getpid())
        try:
            _loop(paths, driver, poller)
        except BaseException as exc:
            stopped = isinstance(exc, KeyboardInterrupt | DriverStopped)
            driver.update(state="stopped" if stopped else "failed", detail=str(exc).splitlines()[0] if str(exc) else
                          type(exc).__name__)
            raise
        driver.update(state="done")


def _loop(paths: SweepPaths, driver: DriverFile, poller: Poller | None) -> None:
    manifest = Manifest(paths).read()
    search = manifest.search
    assert search is not None, "not a search sweep"
    opened = study.open_study(paths, search, manifest.prune)
    prunes = manifest.prune is not None and manifest.executor == "slurm"
    _recover(paths, manifest)
    # While it prunes, the driver reads running trials at least every check_s.
    poller = poller or Poller(first_s=1.0, max_s=manifest.prune.check_s if manifest.prune and prunes
                              else DEFAULT_MAX_S, sleep=_sleep)
    while True:
        if STOP.is_set():
            raise DriverStopped("stopped by SIGTERM (`slurmkit sweep cancel`)")
        manifest = adopt_asked(paths, Manifest(paths).read(), opened)
        if (orphans := never_submitted(manifest)):
            submit_tasks(paths, manifest, orphans)
            continue
        try:
            states = task_states(paths, manifest)
        except TransientSlurmError as exc:
            print(f"slurm did not answer ({exc}); asking again", flush=True)
            poller.wait()
            continue
        pruned = driver.read().pruned
        if tell_ended(paths, opened, states, search.metric, pruned):
            _say_best(opened, search.mode)
        if any(is_active(s.state) for s in states):
            if prunes:
                prune_running(paths, manifest, opened, states, driver, pruned)
            poller.wait()
            continue
        if len(manifest.tasks) >= study.budget(opened, search):
            return
        ask_batch(paths, manifest, opened)  # submitted next round, as a dead driver's would be
        poller = Poller(first_s=poller.first_s, max_s=poller.max_s, sleep=poller.sleep)  # each batch's wait anew


def _say_best(opened: Any, mode: str) -> None:
    found = study.best(study.trials(opened), mode)
    if found is not None:
        print(f"best so far: trial {found.number} = {found.value:g} {found.params}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurmkit.sweeps.search")
    parser.add_argument("--sweep-dir", required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: STOP.set())
    try:
        drive(SweepPaths(Path(args.sweep_dir)))
    except SlurmkitError as exc:
        print(f"slurmkit: {exc.one_line()}", file=sys.stderr, flush=True)
        return 1
    except DriverStopped as exc:
        print(f"slurmkit: {exc}", flush=True)
        return 143
    return 0


if __name__ == "__main__":
    sys.exit(main())
