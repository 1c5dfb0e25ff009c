"""What the laptop sends the login host with each forwarded command (one SSH argument, base64
JSON): the operation, the command line, the profile's layers, the versions to compare, whether
a tar stream of files follows on stdin."""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from dataclasses import asdict, dataclass, field
from typing import Literal

from slurmkit.errors import SlurmkitError
from slurmkit.jsontypes import JsonObject

STAGE_PREFIX = "slurmkit-stage:"
"""An argument that names a file sent along: its path in the stage, there."""
_STAGE_ID = re.compile(r"^[0-9a-f]{32}$")
_FILE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class VersionMismatchError(SlurmkitError):
    """The login host's slurmkit (or, for a pickled function, Python) is not the laptop's."""


@dataclass
class Request:
    op: Literal["run", "hello", "fetch", "api"]
    argv: list[str] = field(default_factory=list)
    profile: list[tuple[str, JsonObject]] = field(default_factory=list)
    """The profile's layers, ancestors first: (file name, mapping), `extends` and `login` taken out."""
    files: bool = False
    """A tar stream follows on stdin: work/ (the code, for a snapshot) and files/ (arguments)."""
    origin: JsonObject | None = None
    """Where the snapshot's code came from on the laptop (folder, git commit, dirty)."""
    workdir: str = ""
    """The working folder, relative to the code sent along (a subfolder of a git tree)."""
    command: str = ""
    pickled: bool = False
    """Something pickled here is loaded there (a function from Python): Python must match too."""
    slurmkit: str = ""
    python: str = ""
    api: JsonObject | None = None
    """A Python API method and its parameters (slurmkit.remote.api)."""
    stage_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def encode(self) -> str:
        return base64.urlsafe_b64encode(json.dumps(asdict(self)).encode()).decode()

    @classmethod
    def decode(cls, text: str) -> Request:
        try:
            data = json.loads(base64.urlsafe_b64decode(text.encode()))
            _check_types(data)
            req = cls(**data)
            req.profile = [(str(n), dict(d)) for n, d in req.profile]
        except (ValueError, TypeError, binascii.Error) as exc:
            raise SlurmkitError(f"not a slurmkit request: {exc}", where="slurmkit.cli.serve_command",
                                valid="valid: what slurmkit on a laptop sends") from None
        cls.checked_stage_id(req.stage_id)
        if not req.profile and req.op in ("run", "api"):
            raise SlurmkitError("a request without its profile", where="slurmkit.cli.serve_command")
        for name, _ in req.profile:
            if not _FILE_NAME.match(name) or name in (".", ".."):
                raise SlurmkitError(f"bad profile file name {name!r}", where="slurmkit.cli.serve_command",
                                    valid="valid: a file name without /")
        if req.workdir.startswith("/") or ".." in req.workdir.split("/"):
            raise SlurmkitError(f"bad working folder {req.workdir!r}", where="slurmkit.cli.serve_command",
                                valid="valid: a folder inside the code sent along")
        return req

    @staticmethod
    def checked_stage_id(stage_id: str) -> str:
        if not _STAGE_ID.match(stage_id):
            raise SlurmkitError("bad stage id", where="slurmkit.cli.serve_command", valid="valid: 32 hex digits")
        return stage_id

    def check_versions(self, here: dict[str, str]) -> None:
        """slurmkit must be the same on both sides (they read each other's records); Python's
        major.minor too when what is pickled on one side is loaded on the other."""
        if self.slurmkit != here["slurmkit"]:
            raise VersionMismatchError(f"slurmkit {self.slurmkit} here, {here['slurmkit']} on the login host",
                                       where="profile:login.python",
                                       valid=f"valid: install slurmkit {self.slurmkit} for that interpreter")
        if self.pickled and minor(self.python) != minor(here["python"]):
            raise VersionMismatchError(f"Python {self.python} here, {here['python']} on the login host",
                                       where="profile:login.python",
                                       valid=f"valid: an interpreter of Python {minor(self.python)} there")


_TYPES: dict[str, type | tuple[type, ...]] = {
    "op": str, "argv": list, "profile": list, "files": bool, "origin": (dict, type(None)), "workdir": str,
    "command": str, "pickled": bool, "slurmkit": str, "python": str, "api": (dict, type(None)), "stage_id": str}


def _check_types(data: object) -> None:
    """Each field of a decoded request is of its type (a TypeError names the first that is not)."""
    if not isinstance(data, dict):
        raise TypeError("not a mapping")
    for key, value in data.items():
        want = _TYPES.get(key)
        if want is None or not isinstance(value, want):
            raise TypeError(f"field {key!r} is {type(value).__name__}")
    if data.get("op", "run") not in ("run", "hello", "fetch", "api"):
        raise TypeError(f"unknown op {data['op']!r}")
    if not all(isinstance(a, str) for a in data.get("argv", [])):
        raise TypeError("field 'argv' holds a value that is not text")
    if not all(isinstance(p, list) and len(p) == 2 and isinstance(p[1], dict) for p in data.get("profile", [])):
        raise TypeError("field 'profile' holds a layer that is not [name, mapping]")


def minor(version: str) -> str:
    return ".".join(version.split(".")[:2])
