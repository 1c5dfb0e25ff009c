"""`slurmkit connect`: the one authentication, and the versions on both sides compared."""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass

from slurmkit import __version__
from slurmkit.remote.connection import ConnectError
from slurmkit.remote.forward import Site, serve_argv
from slurmkit.remote.request import Request, VersionMismatchError, minor


@dataclass(frozen=True)
class Hello:
    destination: str
    slurmkit: str
    python: str
    python_here: str

    @property
    def python_note(self) -> str | None:
        """A Python mismatch: specs and commands still work; functions from Python do not."""
        if minor(self.python) == minor(self.python_here):
            return None
        return (f"Python {self.python} on the login host, {self.python_here} here: functions submitted from "
                f"Python need the same Python {minor(self.python_here)} there")

    def as_dict(self) -> dict[str, object]:
        return asdict(self) | {"python_note": self.python_note}


def connect(site: Site) -> Hello:
    """Open the master (interactive: ssh may ask for a password or a code) and compare versions;
    a slurmkit mismatch is refused in one line."""
    conn = site.connection
    conn.open(interactive=True)
    done = conn.call(serve_argv(site.login, Request("hello", slurmkit=__version__)))
    try:
        there = json.loads(done.stdout)
    except ValueError:
        err = done.stderr.decode(errors="replace").strip().splitlines()
        raise ConnectError(f"{site.login.python} -m slurmkit.remote.serve failed on {site.login.destination}: "
                           f"{err[-1] if err else 'no answer'}", where="profile:login.python",
                           valid="valid: an interpreter there with slurmkit installed") from None
    if there["slurmkit"] != __version__:
        raise VersionMismatchError(f"slurmkit {__version__} here, {there['slurmkit']} on the login host",
                                   where="profile:login.python",
                                   valid=f"valid: install slurmkit {__version__} for that interpreter")
    return Hello(site.login.destination, there["slurmkit"], there["python"], platform.python_version())
