"""One root error class; the CLI turns any SlurmkitError into one line and an exit code."""

from __future__ import annotations

import difflib
import sys
from collections.abc import Iterable

# Re-exported: the rest of slurmkit takes a message's helpers from here, with its error classes.
from slurmkit.config.text import CLIP_CHARS as CLIP_CHARS
from slurmkit.config.text import clip as clip
from slurmkit.config.text import cut as cut


class SlurmkitError(Exception):
    """A user-facing error: the message is one line saying what, where and what is valid."""

    exit_code = 2

    def __init__(self, message: str, *, where: str | None = None, valid: str | None = None) -> None:
        self.what = message
        self.where = where
        self.valid = valid
        super().__init__(self.one_line())

    def one_line(self) -> str:
        """where: what, then what is valid; a hint that is not a `valid: ...` list is its own clause
        (`...can be resubmitted; submit a local run again with ...`), never run on into the sentence."""
        line = f"{self.where}: {self.what}" if self.where else self.what
        if self.valid:
            line += (" " if self.valid.startswith(("valid", "matches")) else "; ") + self.valid
        return line.replace("\n", " ")

    def details(self, verbose: bool = False) -> list[str]:
        """Lines shown under the one line (a failed job's frames); none for a user error."""
        return []


class ConfigError(SlurmkitError):
    """A profile, run spec or --set override is invalid."""


class RenderError(SlurmkitError):
    """A template could not be rendered."""


class SlurmError(SlurmkitError):
    """A Slurm command failed, timed out, or the controller is unreachable."""

    exit_code = 3


class PreflightError(SlurmkitError):
    """The request does not fit the live cluster's limits."""


class RunNotFoundError(SlurmkitError):
    """No run with that id exists under the run root."""


class JobFailedError(SlurmkitError):
    """The job ran and failed. The message leads with the failing rank and its cause (the exception
    line, or a command's exit code); `trace` holds the last frames of the user's own code, `log_tail`
    the last lines of that rank's output (stdout, then stderr), `full` the rank's whole traceback,
    slurmkit's and submitit's frames included (what `--verbose` shows)."""

    exit_code = 4

    def __init__(self, message: str, *, where: str | None = None, valid: str | None = None,
                 log_tail: str = "", rank: int | None = None, cause: str = "", trace: tuple[str, ...] = (),
                 full: str = "") -> None:
        self.log_tail = log_tail
        self.rank = rank
        self.cause = cause
        self.trace = trace
        self.full = full
        super().__init__(message, where=where, valid=valid)

    def details(self, verbose: bool = False) -> list[str]:
        """The user's own last frames; verbose: the whole traceback, then the rank's last output."""
        if not verbose:
            return [ln for frame in self.trace for ln in frame.splitlines()]
        tail = [f"-- rank {self.rank}'s last output --", *self.log_tail.splitlines()] if self.log_tail else []
        return [*self.full.rstrip().splitlines(), *tail]

    def __str__(self) -> str:
        return "\n".join([self.one_line(), *(f"  {ln}" for ln in self.details())])


class DevClusterError(SlurmkitError):
    """The dev cluster could not be brought up or down."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def warn(message: str) -> None:
    """One warning line on stderr: something was skipped or degraded, and the command goes on."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def squash(text: str, limit: int | None = 300, tail: bool = True) -> str:
    """Error text on one line, at most `limit` characters: its end (where a traceback says what went
    wrong), or with tail=False its start (where a message says it)."""
    flat = " ".join(text.split())
    if limit is None or len(flat) <= limit:
        return flat
    return flat[-limit:] if tail else flat[:limit]
