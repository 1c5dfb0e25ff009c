"""A sweep's job arrays sent to sbatch, each array's job id recorded in the array log as soon as it
exists (so no task is ever dropped silently), and the live cluster's limits they must fit."""

from __future__ import annotations

import datetime as dt
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from slurmkit import trust
from slurmkit.build import ArraySpec, build
from slurmkit.calls import SweepTask
from slurmkit.common import perms
from slurmkit.common.atomic import atomic_write_text
from slurmkit.common.record import RunFile
from slurmkit.common.sweep_layout import ArrayEntry, ArrayLog, SweepPaths
from slurmkit.config.resolved import Resolved
from slurmkit.errors import SlurmError, SlurmkitError, squash
from slurmkit.jsontypes import JsonObject
from slurmkit.slurm import commands
from slurmkit.slurm.submitter import submitter
from slurmkit.sweeps.plan import compress


def cluster_limits() -> tuple[int, int]:
    """(MaxArraySize, MaxJobCount) of the live cluster."""
    conf = commands.show_config()
    return int(conf.get("MaxArraySize", "1001")), int(conf.get("MaxJobCount", "10000"))


def submit_arrays(paths: SweepPaths, groups: list[Resolved], planned: list[JsonObject],
                   kind: Literal["initial", "resubmit"], dependency: str | None, max_parallel: int | None) -> list[str]:
    """sbatch each planned array, recording each job id in the array log as soon as it exists."""
    created = dt.datetime.now().isoformat(timespec="seconds")
    arrays = [ArrayEntry(kind=kind, created=created, **arr) for arr in planned]
    chain = max_parallel and len(arrays) > 1
    with ArrayLog(paths).editing() as log:
        first_number = len(log.arrays)
        log.arrays.extend(arrays)
    ids: list[str] = []
    for k, arr in enumerate(arrays):
        deps = [d for d in (dependency, f"afterany:{ids[-1]}" if chain and ids else None) if d]
        spec = ArraySpec(arr.array, [i - arr.base for i in arr.indices], arr.base, str(paths.sweep_dir),
                         str(paths.array_pickle(first_number + k)))
        executor = submitter().RenderedSlurmExecutor(
            build(groups[arr.group], paths.job_folder, array=spec, dependency=",".join(deps) or None))
        executor.before_sbatch = functools.partial(note_sbatch, paths, first_number + k)
        try:
            job_id = executor.submit_sweep_array(SweepTask(str(paths.sweep_dir), arr.base))
        except Exception as exc:
            detail = squash(str(exc))
            with ArrayLog(paths).editing() as log:
                log.arrays[first_number + k].error = detail
            if isinstance(exc, SlurmkitError):
                raise
            queued = first_number + k > 0  # else submit() removes the sweep: nothing to resubmit
            raise SlurmError(f"array {first_number + k} (tasks {compress(arr.indices)}) failed to submit: {detail}",
                             where=paths.sweep_id, valid="its tasks show NOT_SUBMITTED; `slurmkit sweep resubmit "
                             "SWEEP --failed` retries them" if queued else None) from exc
        ids.append(job_id)
        atomic_write_text(paths.script(first_number + k), executor.last_script or "", perms.file_mode(paths.sweep_dir))
        with ArrayLog(paths).editing() as log:
            log.arrays[first_number + k].job_id = job_id
    return ids


def note_sbatch(paths: SweepPaths, number: int, script: Path) -> None:
    """Array `number`'s script name, written before its sbatch runs (`recover` looks it up)."""
    with ArrayLog(paths).editing() as log:
        log.arrays[number].submission, log.arrays[number].sbatch_at = script.name, time.time()


# An sbatch started by a submitter that was killed may still answer until its timeout and kill-after.
LOST_AFTER_S = commands.SBATCH_TIMEOUT_S + commands.SBATCH_KILL_AFTER_S + 5
SCRIPT_LIMIT = 1 << 20
NEVER_QUEUED = "never queued: its submitter stopped before or inside sbatch"


def _lost(paths: SweepPaths) -> dict[int, ArrayEntry]:
    return {n: a for n, a in enumerate(ArrayLog(paths).read().arrays)
            if a.kind != "local" and a.job_id is None and a.error is None}


def recover(paths: SweepPaths, submit_again: Callable[[list[int]], object] | None = None,
            sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.time) -> list[int]:
    """Arrays whose job id was never written (their submitter killed between the entry's write and
    sbatch's answer) get the job id Slurm gave them, found by their script's name; one that Slurm
    never queued (not found once its sbatch can no longer answer) has its tasks given to
    `submit_again` first, then is marked NEVER_QUEUED. So no task of it is lost or run twice. The
    caller is the array log's only writer meanwhile (a search's driver, under its lock; `sweep
    resubmit`). Returns the numbers of the arrays adopted. While an sbatch may still answer, Slurm
    is asked again, backing off."""
    adopted: list[int] = []
    delay = 1.0
    while lost := _lost(paths):
        names = [a.submission for a in lost.values() if a.submission]
        since = min(a.created or "now-7days" for a in lost.values())
        found = commands.jobs_by_script(names, since) if names else {}
        waiting = 0.0
        for n, arr in lost.items():
            job_id = found.get(arr.submission or "")
            left = (arr.sbatch_at or 0.0) + LOST_AFTER_S - clock()
            if job_id is None and arr.submission and left > 0:
                waiting = max(waiting, left)
                continue
            if job_id is None and submit_again is not None:
                submit_again(arr.indices)
            _settle(paths, n, job_id)
            adopted += [n] if job_id else []
        if waiting:
            sleep(min(waiting, delay))
            delay = min(2 * delay, 10.0)
    return adopted


def _settle(paths: SweepPaths, number: int, job_id: str | None) -> None:
    with ArrayLog(paths).editing() as log:
        log.arrays[number].job_id = job_id
        log.arrays[number].error = None if job_id else NEVER_QUEUED
        name = Path(log.arrays[number].submission or "").name
        single = log.arrays[number].indices if log.arrays[number].single else []
    if job_id and single:  # a heterogeneous task's own job (sweeps.hetjobs): its run.json names it too
        RunFile(paths.task(single[0])).add_job_id(job_id)
    script = paths.job_folder / name
    if job_id and name and script.is_file():  # submitit would have moved it under the job id's name
        text = trust.read_own(script, SCRIPT_LIMIT).decode()
        atomic_write_text(paths.script(number), text, perms.file_mode(paths.sweep_dir))
        script.unlink()
