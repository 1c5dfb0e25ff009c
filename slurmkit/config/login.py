"""The profile's `login` block: the login host a laptop reaches the cluster through, over SSH."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from slurmkit.config.fields import Strict, TildePath
from slurmkit.config.text import clip

# What ssh takes as a host (a name, an ssh_config Host alias, an address): never an option.
_HOST = re.compile(r"^[A-Za-z0-9_.:%\[\]-]+$")
_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*\$?$")
_PERSIST = re.compile(r"^(yes|no|\d+[smhdw]?)$")


class LoginHost(Strict):
    """With it, every command of this profile runs on the login host, over one SSH connection
    (docs/remote.md); run_root and checkpoint_root are paths there."""

    host: str = Field(min_length=1)
    """The login host: a name, an address, or a Host alias of your ssh_config."""
    user: str | None = None
    """The account on the login host; unset: ssh's own choice (ssh_config, else your local name)."""
    port: int | None = Field(None, ge=1, le=65535)
    """SSH port; unset: ssh's own choice (ssh_config, else 22)."""
    identity: TildePath | None = None
    """A private key file; unset: ssh's own (ssh_config, agent, ~/.ssh/id_*)."""
    known_hosts: TildePath = "~/.ssh/known_hosts"
    """The file the login host's key must be in. An unknown or changed key is refused, never added."""
    python: str = "python3"
    """The interpreter on the login host that has slurmkit (the same version as here)."""
    control_persist: str = "4h"
    """How long the connection stays open once idle (ssh's ControlPersist: 4h, 30m, 600, yes)."""
    connect_timeout_s: int = Field(20, ge=1, le=600)
    """How long opening the connection may take before it is one error line."""
    reconnects: int = Field(5, ge=0, le=100)
    """How often a `--wait` reopens a dropped connection before it gives up (the run goes on)."""

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        if value.startswith("-") or not _HOST.match(value):
            raise ValueError(f"{clip(value)} is not a host; valid: a host name, an address or an ssh_config alias")
        return value

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        if value is not None and not _USER.match(value):
            raise ValueError(f"{clip(value)} is not a user name; valid: letters, digits, _ . - (not first)")
        return value

    @field_validator("known_hosts", "identity")
    @classmethod
    def _one_file(cls, value: str | None) -> str | None:
        # ssh reads a list of files from a value with blanks: one file, and only the one named.
        if value is not None and (not value.strip() or any(c.isspace() for c in value)):
            raise ValueError(f"{clip(value)} holds a blank; valid: the path of one file, without blanks")
        return value

    @field_validator("control_persist")
    @classmethod
    def _persist(cls, value: str) -> str:
        if not _PERSIST.match(value):
            raise ValueError(f"control_persist {clip(value)} is not a time; valid: yes, or 600, 30m, 4h, 1d")
        return value

    @property
    def destination(self) -> str:
        """user@host, or host."""
        return f"{self.user}@{self.host}" if self.user else self.host
