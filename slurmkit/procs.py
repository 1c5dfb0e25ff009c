"""Process liveness, shared by local runs and the dev cluster's daemons."""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int | None) -> bool:
    """True for a running process; a zombie (finished, not yet reaped) counts as gone."""
    if not pid:
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
