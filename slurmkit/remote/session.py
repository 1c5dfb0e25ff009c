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


def _check_python_there(site: Site) -> None:
    """login.python is a Python slurmkit supports (an older one fails on `-P` before saying anything
    useful). Asked isolated (-I), which every Python 3 takes; quiet where it cannot be asked."""
    done = site.connection.call([site.login.python, "-I", "-c", "import sys; print(*sys.version_info[:3])"])
    version = done.stdout.decode(errors="replace").split()
    if len(version) == 3 and all(v.isdigit() for v in version) and (int(version[0]), int(version[1])) < (3, 11):
        raise VersionMismatchError(f"{site.login.python} on {site.login.destination} is Python {'.'.join(version)}; "
                                   "slurmkit needs 3.11 or newer", where="profile:login.python",
                                   valid="valid: an interpreter there of Python 3.11 or newer, with slurmkit")


def connect(site: Site) -> Hello:
    """Open the master (interactive: ssh may ask for a password or a code) and compare versions;
    a slurmkit mismatch is refused in one line."""
    conn = site.connection
    conn.open(interactive=True)
    done = conn.call(serve_argv(site.login, Request("hello", slurmkit=__version__)))
    try:
        there = json.loads(done.stdout)
    except ValueError:
        _check_python_there(site)
        err = done.stderr.decode(errors="replace").strip().splitlines()
        raise ConnectError(f"{site.login.python} -m slurmkit.cli.serve_command failed on {site.login.destination}: "
                           f"{err[-1] if err else 'no answer'}", where="profile:login.python",
                           valid="valid: an interpreter there with slurmkit installed") from None
    if there["slurmkit"] != __version__:
        raise VersionMismatchError(f"slurmkit {__version__} here, {there['slurmkit']} on the login host",
                                   where="profile:login.python",
                                   valid=f"valid: install slurmkit {__version__} for that interpreter")
    return Hello(site.login.destination, there["slurmkit"], there["python"], platform.python_version())
