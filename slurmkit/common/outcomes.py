"""Each rank's outcome as JSON: written on the compute side when the rank finishes, read by the login side.

`status`, `list`, `sweep status/results` and the requeue policy read only these records, never
submitit's result pickles: a pickle found in a shared folder can run code as whoever loads it,
JSON cannot. `result` alone unpickles, and only from a folder the caller owns (slurmkit.common.perms).

One record per (job id, rank): outcomes/<job_id>_<rank>.json in the run folder, an Outcome
(restart_count: Slurm's incarnation; attempt: the srun step within it, slurmkit's in-job restarts).
A rank that stops to be requeued writes none: that incarnation has no result.
Torch-free: both sides import it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict

from slurmkit.common.atomic import atomic_write_text
from slurmkit.common.locked import Record

VALUE_MAX_BYTES = 64 * 1024
ERROR_MAX_CHARS = 4000
SUCCESS, ERROR = "success", "error"
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b[^:]*:")
# What gloo, NCCL and the c10d store say when the other side of a collective is gone.
PEER_FAILURE_MARKERS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "DistNetworkError",
                        "NCCL communicator was aborted", "remote process exited or there was a network error")


class Outcome(Record):
    """One rank's outcome record; `record` writes it, `read` reads it."""

    model_config = ConfigDict(frozen=True)

    state: Literal["success", "error"]
    returncode: int = 1
    error: str = ""
    value: Any = None
    value_omitted: str = ""
    """Why `value` is None: not JSON, or too large (`slurmkit result` reads the pickle)."""
    restart_count: int = 0
    attempt: int = 0
    time: str = ""
    cause: str = ""
    """An error's first line for people (common.user_trace): `ValueError: bad input`, or a command's
    `exit code 1: ...`."""
    trace: list[str] = []
    """The last frames of the user's own code (or a command's last stderr lines), newest last."""

    @property
    def ok(self) -> bool:
        return self.state == SUCCESS

    @property
    def error_line(self) -> str:
        """What a traceback says went wrong: its last exception line (`ValueError: bad batch`), else
        its last non-empty line. torch's errors end in a C++ or Python location ("At: ...") after it."""
        lines = [ln.strip() for ln in self.error.strip().splitlines() if ln.strip()]
        return next((ln for ln in reversed(lines) if _EXCEPTION_LINE.match(ln)), lines[-1] if lines else "")

    @property
    def peer_failed(self) -> bool:
        """The error is a collective that lost its peer (a rank killed, a node gone): a consequence
        of another rank's failure, never a sign of a deterministic error of this one."""
        return any(marker in self.error for marker in PEER_FAILURE_MARKERS)


def _json_value(value: object) -> tuple[Any, str]:
    """The value as JSON when it is small and JSON-able; else None and why."""
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return None, f"not JSON-serializable ({type(value).__name__}); `slurmkit result` reads the pickle"
    if len(text) > VALUE_MAX_BYTES:
        return None, f"{len(text)} bytes of JSON, over {VALUE_MAX_BYTES}; `slurmkit result` reads the pickle"
    return value, ""


def restart_count() -> int:
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)


ATTEMPT_ENV = "SLURMKIT_ATTEMPT"


def attempt() -> int:
    """Which srun step of this incarnation the ranks are (0, then 1.. after in-job restarts); the
    job's supervisor sets it (in its own environment, which each step inherits)."""
    return int(os.environ.get(ATTEMPT_ENV, "0") or 0)


def record(path: Path, state: str, *, value: object = None, error: str = "", cause: str = "",
           trace: list[str] | None = None) -> None:
    """Write one rank's outcome atomically (a reader never sees half a record)."""
    shown, omitted = _json_value(value) if state == SUCCESS else (None, "")
    outcome = Outcome(state=SUCCESS if state == SUCCESS else ERROR, returncode=0 if state == SUCCESS else 1,
                      error=error[-ERROR_MAX_CHARS:], value=shown, value_omitted=omitted,
                      restart_count=restart_count(), attempt=attempt(),
                      time=dt.datetime.now().isoformat(timespec="seconds"), cause=cause, trace=trace or [])
    # 0666 narrowed by the job's umask (0077, or 0027 for run_mode group), as its logs and checkpoints.
    # Every field is written, value null included: a reader tells "returned None" from "no value".
    atomic_write_text(path, outcome.model_dump_json() + "\n", mode=0o666)


def read(path: Path) -> Outcome | None:
    """The outcome at path; None when the rank wrote none or the record is unreadable."""
    try:
        return Outcome.model_validate_json(path.read_text())
    except (OSError, ValueError):  # ValueError: pydantic's ValidationError, not UTF-8
        return None
