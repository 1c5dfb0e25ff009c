"""A real login host for the remote tests: Debian's OpenSSH server on the loopback address (its own
port, its own host key, key-only, root the cluster account), and a laptop: another unix user who
cannot read the cluster account's files, running slurmkit's CLI from the same interpreter."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

SSHD = "/usr/sbin/sshd"
ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keygen(path: Path) -> str:
    """An ed25519 key pair at `path`; the public line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True, timeout=30)
    return path.with_suffix(".pub").read_text().strip()


@dataclass
class Sshd:
    port: int
    host_key_line: str
    log: Path
    authorized_keys: Path

    def accepted(self) -> int:
        """Authentications the server let in so far (its log's `Accepted publickey` lines)."""
        return sum("Accepted publickey" in ln for ln in self.log.read_text(errors="replace").splitlines())

    def known_hosts_line(self) -> str:
        return f"[127.0.0.1]:{self.port} {' '.join(self.host_key_line.split()[:2])}"


@contextmanager
def serving(folder: Path) -> Iterator[Sshd]:
    """sshd in the foreground on 127.0.0.1, logging every authentication to folder/sshd.log."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    host_key = folder / "host_key"
    host_line = keygen(host_key)
    keys = folder / "authorized_keys"
    keys.touch(mode=0o600)
    port = _free_port()
    conf = folder / "sshd_config"
    # StrictModes no: the test's keys lie under /tmp, which everyone may write (with the sticky bit).
    conf.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {host_key}", f"PidFile {folder / 'sshd.pid'}",
        f"AuthorizedKeysFile {keys}", "PermitRootLogin prohibit-password", "PubkeyAuthentication yes",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "LogLevel INFO",
        "StrictModes no", "MaxSessions 100", "MaxStartups 100", "PrintMotd no", "X11Forwarding no", ""]))
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder
    log = folder / "sshd.log"
    proc = subprocess.Popen([SSHD, "-D", "-f", str(conf), "-E", str(log)])
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not start: {log.read_text(errors='replace') if log.exists() else ''}")
            time.sleep(0.1)
        yield Sshd(port, host_line, log, keys)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@dataclass
class Laptop:
    """The laptop user: its home, its key (authorized for the cluster account) and its known_hosts."""

    user: str
    home: Path
    identity: Path
    known_hosts: Path

    python: Path

    def env(self) -> dict[str, str]:
        return {"HOME": str(self.home), "USER": self.user, "LANG": "C.UTF-8", "PATH": "/usr/bin:/bin"}

    def slurmkit(self, *args: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """`python -P -m slurmkit ARGS` as the laptop user, in `cwd` (its home by default)."""
        return subprocess.run(self.argv(*args), cwd=cwd or self.home, capture_output=True, text=True, timeout=timeout)

    def argv(self, *args: str) -> list[str]:
        return ["runuser", "-u", self.user, "--", "env", "-i", *(f"{k}={v}" for k, v in self.env().items()),
                str(self.python), "-P", "-m", "slurmkit", *args]

    def write(self, rel: str, text: str) -> Path:
        """A file of the laptop user's own."""
        path = self.home / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        pw = pwd.getpwnam(self.user)
        for p in [path, *[q for q in path.parents if self.home in q.parents]]:
            os.chown(p, pw.pw_uid, pw.pw_gid)
        return path

    def profile(self, name: str, sshd: Sshd, **fields: object) -> Path:
        login = {"host": "127.0.0.1", "port": sshd.port, "user": "root", "identity": str(self.identity),
                 "known_hosts": str(self.known_hosts), "python": sys.executable}
        return self.write(f"profiles/{name}.yaml", yaml.safe_dump({**fields, "login": login}))


def laptop_python(user: str, wheel_dir: Path) -> Path:
    """The laptop's own interpreter (Debian's Python, not the cluster side's) in a venv with
    slurmkit's wheel installed as a user would (`pip install slurmkit`: its own dependencies, which
    bring no torch). One venv a laptop user: the cluster tests' pytest and the others' run side by side."""
    venv = Path(f"/opt/slurmkit-test-{user}")
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(wheel_dir), str(ROOT)], check=True, timeout=300)
    wheel = next(wheel_dir.glob("slurmkit-*.whl"))
    # This tree's wheel replaces the one a former session installed, then its dependencies as pip brings them.
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)],
                   check=True, timeout=300)
    subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheel)], check=True, timeout=600)
    os.chmod(venv, 0o755)
    return python


@contextmanager
def laptop(sshd: Sshd, user: str, wheel_dir: Path) -> Iterator[Laptop]:
    """The laptop user (made once), a fresh home, its key in the cluster account's authorized_keys;
    every process of it ended after (its connection's master among them)."""
    if shutil.which("runuser") is None:
        raise RuntimeError("runuser (util-linux) is missing")
    try:
        pwd.getpwnam(user)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", user], check=True, timeout=60)
    subprocess.run(["pkill", "-KILL", "-u", user], check=False, timeout=30)  # a former session's
    python = laptop_python(user, wheel_dir)
    pw = pwd.getpwnam(user)
    home = Path(pw.pw_dir)
    shutil.rmtree(home / ".cache", ignore_errors=True)
    ssh_dir = home / ".ssh"
    shutil.rmtree(ssh_dir, ignore_errors=True)
    ssh_dir.mkdir(mode=0o700)
    identity = ssh_dir / "id_ed25519"
    with sshd.authorized_keys.open("a") as f:
        f.write(keygen(identity) + "\n")
    known = ssh_dir / "known_hosts"
    known.write_text(sshd.known_hosts_line() + "\n")
    for p in (ssh_dir, identity, identity.with_suffix(".pub"), known):
        os.chown(p, pw.pw_uid, pw.pw_gid)
    try:
        yield Laptop(user, home, identity, known, python)
    finally:
        subprocess.run(["pkill", "-KILL", "-u", user], check=False, timeout=30)
