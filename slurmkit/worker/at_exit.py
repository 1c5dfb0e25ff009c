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
- the default group's gloo worker threads: a DDP model keeps its group referenced to the end (torch
  2.13: ten references more after `del model` and a collection, out of the collector's sight), so
  `destroy_process_group()` leaves its threads running into finalization. A worker frees each work
  it ran afterwards (the tensors and the autograd context it holds need the GIL), and one that
  takes the GIL once finalization has begun is ended inside C++ code: gdb on a core of a plain
  DDP script (tests/user_code/ddp_toy.py, 1 run in 40 to 80) shows a worker in
  ~AsyncAllgatherWork -> take_gil -> pthread_exit -> std::terminate, the main thread in
  Py_FinalizeEx.

So slurmkit's checkpoint threads start through `daemon`, and one atexit handler (installed by the
first slurmkit.Checkpoint or thread) joins those still running, destroys the default group if the
script left it, frees the script's unreachable objects, and then sleeps until every gloo worker
thread waits for work with nothing left to free (`gloo_workers_idle`, read from the kernel's view
of each thread: no worker is left holding a finished work, asking for the GIL), at most
GLOO_IDLE_WAIT_S, while the interpreter is whole. The default group is destroyed by then, so no
worker of it is given new work.
The default group itself is never freed (`keep_default_group`, from the Checkpoint and from
slurmkit's own groups): freeing it from a DDP reducer is a deadlock.
A slurmkit rank process has no finalization (slurmkit.worker.rank leaves with os._exit after
atexit's handlers): there the handler does nothing, so a rank that failed is not held up by a write
it will never commit.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import os
import platform
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

EXIT_JOIN_S = 30.0
"""At most this long, all threads together, for checkpoint threads still running at exit (a write
then is never committed: the wait only spares the process the abort)."""

GLOO_IDLE_WAIT_S = 5.0
"""At most this long at exit for the gloo worker threads to free the works they ran (a worker stuck
on a dead peer's collective never is)."""

_FUTEX = {"x86_64": "202", "aarch64": "98"}
"""futex's syscall number, as /proc/self/task/<tid>/syscall shows it, by architecture."""
_FUTEX_WAIT_BITSET = 9  # glibc's condition-variable wait; a mutex's is FUTEX_WAIT (0)

_live: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
_installed = False
_rank_process = False
_kept: set[int] = set()


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


def keep_default_group() -> None:
    """The default process group, if there is one, is never freed in this process (once per group).

    Freeing a gloo group joins its worker threads. Where the last reference is a DDP reducer's (the
    group destroyed or aborted first, the DDP wrapper dropped after), the join runs with the GIL
    held, while a worker thread may need the GIL to free the last work it ran: a deadlock. gdb on a
    rank stuck in a test of warm restarts: the main thread in ~Reducer -> ~ProcessGroupGloo ->
    thread::join, the worker in ~AsyncWork -> ~ThreadLocalState -> a Python decref -> take_gil. In
    Python's finalization the same worker, taking the GIL, is ended inside C++ code: the abort.
    So the group gets one reference more, never dropped: a reducer's is then never the last, and
    its threads stay idle until the process ends. The cost: an aborted group's few idle threads per
    warm restart, and a destroyed group's memory to the end."""
    tdist = _initialized_dist()
    if tdist is None:
        return
    group = tdist.group.WORLD
    if group is not None and id(group) not in _kept:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))
        _kept.add(id(group))  # its id stays its own: the object is never freed


def _initialized_dist() -> Any:
    """torch.distributed where the process imported it and its default group is up, else None
    (never imported here)."""
    tdist = sys.modules.get("torch.distributed")
    return tdist if tdist is not None and tdist.is_available() and tdist.is_initialized() else None


def gloo_workers_idle() -> bool:
    """Every gloo worker thread of this process (torch names them pt_gloo_runloop) sleeps on its
    condition variable with no timeout: waiting for work, with no finished work left to free. A
    worker taking the GIL sleeps with a timeout (CPython's take_gil), one at work runs or waits on
    its peers with a timeout, one after the queue's lock waits on a mutex. A worker is known by the
    name it gives itself once it runs, so one not yet started is not seen; at a run's exit, after
    its collectives, every worker has started. True where the kernel does not say (another
    architecture, no /proc)."""
    futex = _FUTEX.get(platform.machine())
    if futex is None:
        return True
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return True
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as comm:
                if comm.read().strip() != "pt_gloo_runloop":
                    continue
            with open(f"/proc/self/task/{tid}/syscall") as call:
                fields = call.read().split()  # "nr uaddr op val timeout ...", or "running"
        except OSError:
            continue  # the thread ended meanwhile
        if fields[:1] != [futex] or int(fields[2], 16) & 0x7F != _FUTEX_WAIT_BITSET or fields[4] != "0x0":
            return False
    return True


def wait_gloo_idle(timeout: float) -> bool:
    """Sleep, the GIL released, until gloo_workers_idle(), at most `timeout` s; whether they are."""
    deadline = time.monotonic() + timeout
    pause = 0.001
    while not gloo_workers_idle():
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)  # a worker waiting for the GIL takes it now
        pause = min(2 * pause, 0.05)
    return True


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
    keep_default_group()
    tdist = _initialized_dist()
    if tdist is not None:
        tdist.destroy_process_group()
    gc.collect()  # the script's dropped objects (a model, its tensors) freed now, not in finalization
    wait_gloo_idle(GLOO_IDLE_WAIT_S)
