"""What each rank process runs: submitit's worker, then an exit without Python's finalization.

    python -u -m slurmkit.worker.rank FOLDER

srun ends a step only once every process of it has exited, so what a rank spends exiting after
its work is done, every restart waits for: an in-job restart (the standby ranks start when the
failed step has ended), a requeue (the job is COMPLETING until then) and a run's end. Most of a
normal exit is Python's finalization of the modules a rank has imported: measured on the dev
cluster's machine, 0.5 s after `import torch`, 0.7 s with `torch._dynamo` as well, where
`os._exit` takes 0.02 s. That was most of the 1.4-1.7 s a killed rank's in-job restart took.

So a rank runs submitit's worker (`submitit.core._submit`, unchanged) as its main module, then
does what a normal exit does short of the finalization, and leaves with `os._exit`:
- an uncaught exception is reported by `sys.excepthook`, as Python would (exit status 1;
  `SystemExit` gives its code, as Python would);
- the process's other (non-daemon) threads are waited for;
- atexit's handlers run (logging's flush among them), then stdout and stderr are flushed.
Nothing a rank writes relies on the finalization: the outcome record, submitit's result and the
checkpoints are written and renamed before the worker returns, and the metrics file is
line-buffered.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
import runpy
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

from submitit.core import utils as submitit_utils

from slurmkit import trust
from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import STACK_SIGNAL, RankProcess
from slurmkit.common.slurm_env import slurm_job_id
from slurmkit.worker import at_exit

ENTRY = "submitit.core._submit"
EXIT_WATCH_S = 60.0


def _answer_stack_requests(folder: str) -> None:
    """`slurmkit stack` (runs.stack): every thread's Python stack to this rank's log on STACK_SIGNAL,
    written by faulthandler from the signal itself (it answers while the main thread is stuck in a
    collective); and where this rank runs, for when it cannot answer (stopped, gone). A run's job
    folder is RunPaths' job_folder, inside the run folder (a sweep task's is not: no marker there)."""
    faulthandler.register(getattr(signal, f"SIG{STACK_SIGNAL}"), file=sys.stderr, all_threads=True, chain=False)
    paths, job_id = RunPaths(Path(folder).parent), slurm_job_id()
    rank = os.environ.get("SLURM_PROCID", "")
    if paths.job_folder == Path(folder) and paths.record.exists() and job_id and rank.isdigit():
        with contextlib.suppress(OSError):  # a run folder gone is the job's business, not this marker's
            RankProcess(socket.gethostname(), os.getpid(), time.time()).write(paths, job_id, int(rank))


def exit_status(code: object) -> int:
    """The exit status Python gives for `SystemExit(code)`: None is 0, an int itself, anything else is
    printed to stderr and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def watch_the_way_out() -> None:
    """A task's last line, in a rank process: should the rank not reach finish() within EXIT_WATCH_S,
    every thread's stack goes to its log (faulthandler's own thread: it needs no GIL). Nothing where
    no rank process runs (a test calling a task in its own process)."""
    if at_exit.in_rank_process():
        faulthandler.dump_traceback_later(EXIT_WATCH_S, exit=False)


def run(folder: str) -> NoReturn:
    """Run submitit's worker for the job folder in this process, then exit without finalization.

    The job's pickle is loaded only from a file of the caller's own (trust.load_pickle, on the open
    file). This interpreter was started with -P; PYTHONSAFEPATH, where a launcher set it for that,
    is dropped so a user's own command started from here keeps Python's usual rules."""
    at_exit.mark_rank_process()
    os.environ.pop("PYTHONSAFEPATH", None)
    _answer_stack_requests(folder)
    submitit_utils.pickle_load = _own_pickle
    sys.argv = [ENTRY, folder]
    try:
        runpy.run_module(ENTRY, run_name="__main__", alter_sys=True)
        status = 0
    except SystemExit as stop:
        status = exit_status(stop.code)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    finish(status)


def _own_pickle(filename: str | Path) -> Any:
    """submitit's pickle_load, for the job's own pickles only: another user's is refused."""
    return trust.load_pickle(filename, "the job")


def finish(status: int) -> NoReturn:
    """A normal exit's work (other threads, atexit), then os._exit(status)."""
    faulthandler.cancel_dump_traceback_later()  # watch_the_way_out's: it got here
    # The interpreter's own first exit step: threading's exit hooks, which stop the idle workers of
    # every ThreadPoolExecutor (inductor's compile pool among them: joined without it, they wait
    # for work forever), then every non-daemon thread joined.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def main(argv: list[str] | None = None) -> NoReturn:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m slurmkit.worker.rank FOLDER", file=sys.stderr)
        os._exit(2)
    run(args[0])


if __name__ == "__main__":
    main()
