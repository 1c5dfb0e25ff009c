"""One SSH connection to a profile's login host: an OpenSSH master (ControlMaster), opened once and
used by every later command until it has been idle for `control_persist`.

Only the master authenticates. Every command goes through its socket with ssh's own ways to
authenticate switched off, so a command can never open a second authentication: with the master
gone it fails (exit 255), and the caller reopens the master (`open`), one authentication, or says
to run `slurmkit connect`. Host keys are checked strictly against the profile's known_hosts: an
unknown or changed key is refused in one line, never added.

The master's socket lives in a folder only the caller can reach (~/.cache/slurmkit/ssh, 0700),
checked when it is made and each time it is used; its name is a hash of the destination.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import re
import shlex
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from slurmkit import trust
from slurmkit.config.login import LoginHost
from slurmkit.errors import SlurmkitError, clip

CHECK_TIMEOUT_S = 15
CALL_TIMEOUT_S = 300
LOST = 255  # ssh's own exit status: the connection failed or was lost
# What a command's ssh may not do by itself: authenticate (only the master does), or ask anything.
NO_AUTH = ("BatchMode=yes", "PubkeyAuthentication=no", "PasswordAuthentication=no",
           "KbdInteractiveAuthentication=no", "GSSAPIAuthentication=no", "HostbasedAuthentication=no",
           "IdentityFile=/dev/null", "IdentitiesOnly=yes", "IdentityAgent=none")
_CHANGED = re.compile(r"REMOTE HOST IDENTIFICATION HAS CHANGED|Host key for .* has changed")
_UNKNOWN = re.compile(r"No \S+ host key is known for|Host key verification failed")


class HostKeyProblem(enum.Enum):
    UNKNOWN = "unknown"
    CHANGED = "changed"


class ConnectError(SlurmkitError):
    """The login host could not be reached or would not let us in."""

    exit_code = 3


class HostKeyError(ConnectError):
    """The login host's key is not the one in known_hosts: refused, never added."""

    def __init__(self, problem: HostKeyProblem, host: str, known_hosts: str) -> None:
        self.problem = problem
        what = ("is not in" if problem is HostKeyProblem.UNKNOWN else "differs from the one in")
        super().__init__(f"{host}'s host key {what} {known_hosts}: refused", where="profile:login.known_hosts",
                         valid="valid: check the key's fingerprint with your site, then add it to that file "
                               "(ssh-keyscan HOST >> FILE)")


@dataclass(frozen=True)
class Connection:
    login: LoginHost
    profile_name: str

    @property
    def control_path(self) -> str:
        """The master's socket: named by a hash of where it leads and how it was checked (host,
        port, user, key, known_hosts), so a stale one (its master killed) can be removed before a
        new master binds there, and a profile that trusts other host keys never shares it."""
        lg = self.login
        key = json.dumps([lg.destination, lg.port, lg.identity, os.path.expanduser(lg.known_hosts)])
        return str(control_dir() / hashlib.sha256(key.encode()).hexdigest()[:32])

    def _options(self) -> list[str]:
        lg = self.login
        opts = [f"ControlPath={self.control_path}", "StrictHostKeyChecking=yes",
                f"UserKnownHostsFile={trusted_known_hosts(lg.known_hosts)}", f"ConnectTimeout={lg.connect_timeout_s}",
                "ServerAliveInterval=10", "ServerAliveCountMax=3", "LogLevel=ERROR"]
        if lg.port:
            opts.append(f"Port={lg.port}")
        return [a for o in opts for a in ("-o", o)]

    def ssh_argv(self, remote: Sequence[str], tty: bool = False) -> list[str]:
        """ssh through the master (never authenticating by itself) running `remote` on the login host."""
        no_auth = [a for o in NO_AUTH for a in ("-o", o)]
        return ["ssh", *self._options(), "-o", "ControlMaster=no", *no_auth, "-t" if tty else "-T",
                self.login.destination, "--", shlex.join(remote)]

    def _control(self, command: str) -> bool:
        """`ssh -O COMMAND` to the master; whether it answered."""
        try:
            done = subprocess.run(["ssh", *self._options(), "-O", command, self.login.destination],
                                  stdin=subprocess.DEVNULL, capture_output=True, timeout=CHECK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0

    def is_open(self) -> bool:
        """Whether the master runs."""
        return self._control("check")

    def open_unless_socket(self) -> None:
        """open(), unless the master's socket is there (no `ssh -O check`: a read-only command
        that then finds the master dead opens it and is asked again)."""
        if not Path(self.control_path).exists():
            self.open(interactive=False)

    def open(self, interactive: bool) -> None:
        """Start the master unless it runs: the one authentication. interactive: ssh may ask for a
        password or a code on the terminal; else it may not, and a login that needs one says to
        run `slurmkit connect`."""
        if self.is_open():
            return
        # A master that was killed leaves its socket behind; ssh would then run without one.
        Path(self.control_path).unlink(missing_ok=True)
        lg = self.login
        argv = ["ssh", *self._options(), "-o", "ControlMaster=yes", "-o", f"ControlPersist={lg.control_persist}",
                "-o", f"BatchMode={'no' if interactive else 'yes'}", "-N", "-f"]
        if lg.identity:
            argv += ["-i", os.path.expanduser(lg.identity), "-o", "IdentitiesOnly=yes"]
        # The backgrounded master keeps what it was given open: stderr goes to a file, never a pipe
        # whose end would then never come.
        with tempfile.TemporaryFile() as err:
            try:
                done = subprocess.run([*argv, lg.destination], stdin=None if interactive else subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=err, timeout=lg.connect_timeout_s + 300
                                      if interactive else lg.connect_timeout_s + 5)
            except subprocess.TimeoutExpired:
                raise ConnectError(f"connecting to {lg.destination} took over {lg.connect_timeout_s} s",
                                   where="profile:login.host") from None
            err.seek(0)
            message = err.read().decode(errors="replace")
        if done.returncode != 0:
            raise self._refusal(message, interactive)

    def _refusal(self, message: str, interactive: bool) -> ConnectError:
        lg = self.login
        if _CHANGED.search(message):
            return HostKeyError(HostKeyProblem.CHANGED, lg.host, lg.known_hosts)
        if _UNKNOWN.search(message):
            return HostKeyError(HostKeyProblem.UNKNOWN, lg.host, lg.known_hosts)
        last = clip(" ".join(message.split()), 200) or "no message"
        hint = "" if interactive else (f"; run `slurmkit connect -p {self.profile_name}` "
                                       "(it may ask for a password or code)")
        return ConnectError(f"ssh to {lg.destination} failed: {last}{hint}", where="profile:login")

    def close(self) -> bool:
        """Stop the master; False when none ran."""
        return self._control("exit")

    def call(self, remote: Sequence[str], timeout_s: float = CALL_TIMEOUT_S) -> subprocess.CompletedProcess[bytes]:
        """Run `remote` on the login host through the master, its output captured (a short answer:
        `hello`, a fetch). A forwarded command streams instead (slurmkit.remote.forward)."""
        try:
            return subprocess.run(self.ssh_argv(remote), stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise ConnectError(f"{self.login.destination} did not answer within {timeout_s:.0f} s",
                               where="profile:login") from None


def trusted_known_hosts(value: str) -> str:
    """The known_hosts file, checked as every file slurmkit trusts: the caller's (or root's), written
    by no one else, in folders no one else can swap it in (so ssh opens what was checked); else
    NotOwnError in one line. A missing one is ssh's to report (an unknown host key)."""
    path = Path(os.path.expanduser(value))
    if os.path.lexists(path):
        trust.check(trust.reason(path, follow=True) or trust.chain_reason(path.parent)
                    or trust.chain_reason(Path(os.path.realpath(path)).parent), str(path),
                    "valid: a known_hosts file of your own that no one else can write (profile:login.known_hosts)")
    return str(path)


def control_dir() -> Path:
    return private_cache("ssh")


def private_cache(name: str) -> Path:
    """~/.cache/slurmkit/NAME (or under $XDG_CACHE_HOME), made 0700 and checked: no one else can
    reach or swap what is in it (the master's socket; a forwarded command's stage)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "slurmkit" / name
    return trust.private_folder(base, "XDG_CACHE_HOME", "the connection's socket")
