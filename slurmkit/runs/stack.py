"""`slurmkit stack RUN`: every rank's Python stack now, without stopping the run; for a hung run the
first thing to look at.

The job steps' processes are sent STACK_SIGNAL (scancel --signal, by number); each rank process answers from the
signal itself (faulthandler, registered by worker.rank), every thread's stack appended to its log,
so a rank stuck in a collective answers too. What a rank appended since the signal is its answer. A
rank that does not answer within the wait is looked at where it runs (its RankProcess marker; one
`srun --overlap` into the job reads its /proc state): stopped (SIGSTOP, a debugger), or gone.
"""

from __future__ import annotations

import signal
import time
from dataclasses import asdict, dataclass

from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import STACK_SIGNAL, RankProcess
from slurmkit.common.record import RunFile
from slurmkit.errors import SlurmkitError
from slurmkit.jsontypes import JsonObject
from slurmkit.runs.jobs import is_active, statuses
from slurmkit.slurm import commands

DUMP_HEAD = "(most recent call first):"
"""How faulthandler starts each thread of a dump."""
STATES = {"R": "running", "S": "sleeping", "D": "in the kernel (uninterruptible)", "T": "stopped",
          "t": "stopped by a debugger", "Z": "exited (zombie)"}


@dataclass(frozen=True)
class RankStack:
    rank: int
    answered: bool
    stack: str
    """faulthandler's dump: every thread, most recent call first ("" without an answer)."""
    state: str = ""
    """Without an answer, the process's state where it runs (STATES), or why it is not known."""
    host: str = ""
    pid: int = 0

    def as_dict(self) -> JsonObject:
        return asdict(self)


def _size(paths: RunPaths, job_id: str, rank: int) -> int:
    try:
        return paths.rank_log(job_id, rank, "err").stat().st_size
    except FileNotFoundError:
        return 0


def _dump(paths: RunPaths, job_id: str, rank: int, offset: int) -> str:
    """The dump the rank appended after `offset`: from its first thread's header to its last frame."""
    try:
        with paths.rank_log(job_id, rank, "err").open("rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.endswith(DUMP_HEAD)), None)
    if start is None:
        return ""
    kept = [ln for ln in lines[start:] if ln.endswith(DUMP_HEAD) or ln.startswith("  File ") or not ln.strip()]
    return "\n".join(kept).strip()


def _state(job_id: str, where: RankProcess | None) -> str:
    """The rank process's state, read where it runs (one srun step beside the job's own)."""
    if where is None:
        return "unknown (the rank left no record of where it runs)"
    try:
        code = commands.process_state(job_id, where.host, where.pid)
    except SlurmkitError as exc:
        return f"unknown ({exc.what})"
    return STATES.get(code, code or f"gone (no process {where.pid} on {where.host})")


def stacks(paths: RunPaths, wait_s: float = 10.0) -> list[RankStack]:
    """Every rank's stack now; ranks that do not answer within `wait_s` come with their process state."""
    record = RunFile(paths).read()
    state = statuses([(paths, record)])[0]  # the record read once
    if record.executor != "slurm" or not record.job_ids or not is_active(state.state):
        raise SlurmkitError(f"run {paths.run_id} is not running on Slurm (state {state.state})",
                            valid="stack looks at a live Slurm run: `slurmkit status` lists them")
    job_id, ranks = record.job_ids[-1], range(record.num_tasks)
    offsets = {r: _size(paths, job_id, r) for r in ranks}
    # By number: scancel knows only a few signals by name (not WINCH); 28 on every Linux.
    commands.scancel([job_id], signal=str(int(getattr(signal, f"SIG{STACK_SIGNAL}"))), steps_only=True)
    answers: dict[int, str] = {}
    deadline, pause = time.monotonic() + wait_s, 0.05
    while len(answers) < len(offsets) and time.monotonic() < deadline:
        time.sleep(pause)
        pause = min(pause * 2, 1.0)  # backs off: a dump is a few ms, a slow filesystem shows it later
        for r in ranks:
            if r not in answers and (dump := _dump(paths, job_id, r, offsets[r])):
                answers[r] = dump
    out = []
    for r in ranks:
        where = RankProcess.read(paths, job_id, r)
        host, pid = (where.host, where.pid) if where else ("", 0)
        if r in answers:
            out.append(RankStack(r, True, answers[r], "", host, pid))
        else:
            out.append(RankStack(r, False, "", _state(job_id, where), host, pid))
    return out
