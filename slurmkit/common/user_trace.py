"""Why a rank failed, as a person wants it first: the exception line (or a command's exit code and
the exception its own Python printed) and the last frames of the user's own code. slurmkit's and
submitit's own frames are cut; the whole traceback stays in the rank's log (`slurmkit logs`).

The rank computes it when it fails (worker.entry) and its outcome record carries it (common.outcomes);
`result`, `submit --wait`, `status` and JobFailedError lead with it. Torch-free.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import traceback
from collections.abc import Iterable

MAX_FRAMES = 5
MAX_LINES = 10
_TRACEBACK = "Traceback (most recent call last):"
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?")
"""torch.distributed's excepthook prints an uncaught exception's lines as `[rank0]: ...`."""
_FRAME_RE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>.+)$')
Frame = tuple[str, int, str, str]
"""(file, line, function, code)"""


@functools.cache
def _own_roots() -> tuple[str, ...]:
    """The folders of slurmkit's and submitit's own modules."""
    roots: list[str] = []
    for name in ("slurmkit", "submitit"):
        spec = importlib.util.find_spec(name)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            roots.append(os.path.realpath(folder) + os.sep)
    return tuple(roots)


def _user_frames(frames: Iterable[Frame]) -> list[str]:
    """The last MAX_FRAMES frames outside slurmkit and submitit, each as Python prints it (two lines)."""
    shown = [f'File "{file}", line {line}, in {name}' + (f"\n    {code}" if code else "")
             for file, line, name, code in frames if not os.path.realpath(file).startswith(_own_roots())]
    return shown[-MAX_FRAMES:]


def of_exception(exc: BaseException) -> tuple[str, list[str]]:
    """(the exception line, e.g. `ValueError: bad input`; the user's last frames)."""
    printed = "".join(traceback.format_exception_only(type(exc), exc)).splitlines()
    # The first line at the margin, `ValueError: first line of the message` (a SyntaxError prints its source first).
    line = next((ln for ln in printed if ln.strip() and not ln[0].isspace()), type(exc).__name__)
    tb = traceback.extract_tb(exc.__traceback__)
    return line, _user_frames((f.filename, f.lineno or 0, f.name, (f.line or "").strip()) for f in tb)


def in_text(text: str) -> tuple[str, list[str]] | None:
    """The last Python traceback printed in `text` (a command's stderr): its exception line and the
    user's frames; None where there is none."""
    lines = [_RANK_PREFIX.sub("", ln) for ln in text.splitlines()]
    starts = [i for i, ln in enumerate(lines) if ln.strip() == _TRACEBACK]
    if not starts:
        return None
    frames: list[Frame] = []
    for i in range(starts[-1] + 1, len(lines)):
        m = _FRAME_RE.match(lines[i])
        if m:
            after = lines[i + 1] if i + 1 < len(lines) else ""
            code = after.strip() if after.startswith("    ") and not _FRAME_RE.match(after) else ""
            frames.append((m["file"], int(m["line"]), m["name"], code))
        elif lines[i].strip() and not lines[i].startswith(" "):  # the first line at the margin: the exception
            return lines[i].strip(), _user_frames(frames)
    return None


def of_command(returncode: int, stderr: str) -> tuple[str, list[str]]:
    """A command that exited non-zero: its exit code and the exception its Python printed, if it did;
    else its last stderr lines."""
    found = in_text(stderr)
    if found is not None:
        return f"exit code {returncode}: {found[0]}", found[1]
    return f"exit code {returncode}", [ln for ln in stderr.splitlines() if ln.strip()][-MAX_LINES:]
