"""What a process that uses slurmkit's checkpoints leaves done before Python's finalization.

A user's own script (`command: python train.py` with a slurmkit.Checkpoint) exits through the
interpreter's finalization, and there torch can abort a process whose work was done: its rank's
log ends with the script's last line, then "terminate called without an active exception" and
exit code -6. The dev cluster saw it after a DDP script's last line (it had called
destroy_process_group()), and the requeue policy took it for a crash and restarted the run in the
job. Two things are still live at that point (pytorch/pytorch PR 179291 and issue 190489 describe
the second):
- a daemon thread inside torch's C++ code (a checkpoint write, the start-up prefetch, the host
  memory reservation): finalization ends such a thread when it next takes the GIL, and an unwind
  through C++ code that may not throw terminates the process;
- the process groups, and the tensors their gloo threads still hold, freed during finalization:
  a DDP module's reference cycles keep its group alive until the last collection.

So slurmkit's checkpoint threads start through `daemon`, and one atexit handler (installed by the
first slurmkit.Checkpoint or thread) joins those still running, destroys the default group if the
script left it, and collects cycles, while the interpreter is whole. A slurmkit rank process has no finalization
(slurmkit.worker.rank leaves with os._exit after atexit's handlers): there the handler does nothing,
so a rank that failed is not held up by a write it will never commit.
"""

from __future__ import annotations

import atexit
import gc
import sys
import threading
import time
import weakref
from collections.abc import Callable

EXIT_JOIN_S = 30.0
"""At most this long, all threads together, for checkpoint threads still running at exit (a write
then is never committed: the wait only spares the process the abort)."""

_live: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
_installed = False
_rank_process = False


def mark_rank_process() -> None:
    """This process is a slurmkit rank (slurmkit.worker.rank.run): it leaves with os._exit after
    atexit's handlers, so it has no finalization to prepare for."""
    global _rank_process
    _rank_process = True


def in_rank_process() -> bool:
    return _rank_process


def install() -> None:
    """The exit handler, once per process (slurmkit.Checkpoint's first use, the first thread)."""
    global _installed
    if not _installed:
        atexit.register(_at_exit)
        _installed = True


def daemon(target: Callable[[], None], name: str) -> threading.Thread:
    """Start `target` in a daemon thread that the exit handler joins if it is still running then."""
    install()
    thread = threading.Thread(target=target, name=name, daemon=True)
    _live.add(thread)
    thread.start()
    return thread


def _at_exit() -> None:
    if _rank_process:
        return
    deadline = time.monotonic() + EXIT_JOIN_S
    for thread in list(_live):
        thread.join(max(0.0, deadline - time.monotonic()))
    tdist = sys.modules.get("torch.distributed")  # never imported here: only where the script did
    if tdist is not None and tdist.is_available() and tdist.is_initialized():
        tdist.destroy_process_group()
    gc.collect()
