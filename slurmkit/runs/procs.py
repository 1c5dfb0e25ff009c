"""Process liveness, shared by local runs and the dev cluster's daemons.

A recorded pid alone proves nothing: the process may have ended and the pid been reused. Local
runs record the start time (/proc/PID/stat field 22, clock ticks since boot) with the pid, and
status and cancel act only on a process that has both.
"""

from __future__ import annotations

import os
import signal as signals
from pathlib import Path

from slurmkit import trust
from slurmkit.common.procfs import group_members
from slurmkit.errors import warn
from slurmkit.runs.polling import Poller

MAX_PID = 2**22
"""Linux's largest pid (pid_max's ceiling, PID_MAX_LIMIT)."""


def pid_alive(pid: int | None) -> bool:
    """True for a running process; a zombie (finished, not yet reaped) counts as gone. A number no
    pid can be (a record's 20-digit job id, a negative one) is no process."""
    if not pid or not 0 < pid <= MAX_PID:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    try:
        return not stat.read_text().split(") ", 1)[-1].startswith("Z")
    except OSError:
        return False


def start_time(pid: int | None) -> int | None:
    """When the process started, in clock ticks since boot; None when there is no such process."""
    if not pid:
        return None
    try:
        # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def same_process(pid: int | str | None, start: int | None) -> bool:
    """Alive and the very process recorded: same pid and same start time (a bare pid is never trusted)."""
    if start is None or not str(pid or "").isdigit():
        return False
    return pid_alive(int(str(pid))) and start_time(int(str(pid))) == start


def signal_process(pid: int | str | None, start: int | None, sig: int = signals.SIGINT) -> bool:
    """Send `sig` only to the recorded process; False when it is gone or the pid now belongs to another."""
    if not same_process(pid, start):
        return False
    try:
        os.kill(int(str(pid)), sig)
    except ProcessLookupError:
        return False
    except PermissionError as exc:  # recorded by the caller, yet another user's process now
        raise trust.NotOwnError(f"process {pid} is not yours to signal", where=f"pid {pid}",
                                valid="valid: a run of your own that is still running") from exc
    return True


GROUP_GRACE_S = 10.0
"""How long a cancelled local job's process group has to end after each signal before the next,
stronger one: SIGINT (the controller stops its ranks), then SIGTERM, then SIGKILL."""


def group_of(pid: int) -> int | None:
    """The process group `pid` is in; None when there is no such process."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


def group_alive(pgid: int) -> bool:
    """Some process of group `pgid` still runs (a zombie, ended and not yet reaped, does not)."""
    return bool(group_members(pgid))


def end_group(pid: int | str | None, start: int | None, grace_s: float = GROUP_GRACE_S) -> bool:
    """End a local job: SIGINT to its controller (the recorded process only), then, where the
    controller leads its own process group (slurmkit starts it so), wait until no process of that
    group is left, sending SIGTERM and then SIGKILL to the group when one outlives its grace: a
    rank's command and the processes it started (a script that went on after training, its data
    loaders) end with it, never reparented to init and left running. False when the controller was
    no longer the recorded process; True once it was signalled (and its group waited for)."""
    if not same_process(pid, start):
        return False
    leader = int(str(pid))
    own_group = group_of(leader) == leader
    if not signal_process(leader, start, signals.SIGINT):
        return False
    if not own_group:  # a controller started before its group was its own: it alone was signalled
        return True
    for sig in (None, signals.SIGTERM, signals.SIGKILL):
        if sig is not None:
            try:
                os.killpg(leader, sig)
            except ProcessLookupError:
                return True
        poller = Poller(first_s=0.05, max_s=0.5)
        while group_alive(leader):
            if poller.elapsed() > grace_s:
                break
            poller.wait()
        else:
            return True
    warn(f"local job {leader}: a process of its group outlived SIGKILL (`ps -g {leader}`): it is in the kernel")
    return True
