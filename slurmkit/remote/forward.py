"""The laptop's side: a command whose profile names a login host runs there, over the profile's
one SSH connection (slurmkit.remote.connection), as `python -P -m slurmkit.cli.serve_command`.

One round trip a command: the command line, the profile and, for a submit, the code (one tar
stream on the same connection) go in one ssh session, and the command's output streams back
(`status` of 100,000 runs is one call; `logs --follow` streams). The exit status is the
command's. A `--wait` is a submit, then `wait RUN`, which is asked again over a reopened
connection when the connection drops (up to login.reconnects times): the run goes on meanwhile.
"""

from __future__ import annotations

import io
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from slurmkit import __version__
from slurmkit.common.atomic import write_output
from slurmkit.config.login import LoginHost
from slurmkit.errors import ConfigError, SlurmkitError
from slurmkit.jsontypes import JsonObject
from slurmkit.load.loader import load_profile, profile_layers, profile_name
from slurmkit.load.yamlio import read_yaml
from slurmkit.remote.connection import LOST, ConnectError, Connection
from slurmkit.remote.request import STAGE_PREFIX, Request
from slurmkit.runs import snapshot

FORWARDED = frozenset({"render", "submit", "resubmit", "status", "list", "logs", "cancel", "result", "wait", "stack",
                       "attach", "shell", "doctor", "report", "track", "nodes", "env", "sweep submit", "sweep status",
                       "sweep results", "sweep resubmit", "sweep resume", "sweep list", "sweep cancel"})
"""Every command that acts on the cluster (tests/unit/test_remote.py holds the CLI to it)."""
LOCAL = frozenset({"connect", "disconnect", "profiles", "devcluster", "bench"})
"""The commands that always run here."""
WITH_SPEC = frozenset({"render", "submit", "sweep submit"})
"""Commands whose first argument is a spec file here, sent along."""
SWEEP_COMMANDS = frozenset(c.split()[1] for c in FORWARDED if c.startswith("sweep "))
READ_ONLY = frozenset({"render", "status", "list", "logs", "result", "wait", "stack", "doctor", "report",
                       "sweep status", "sweep results", "sweep list"})
"""Commands that change nothing: asked again once when the master turns out to be gone."""
TERMINAL = frozenset({"attach", "shell"})
RECONNECT_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0)


@dataclass(frozen=True)
class Site:
    """A profile that names a login host: its connection, and its layers as sent."""

    name: str
    login: LoginHost
    layers: list[tuple[str, JsonObject]]
    snapshot: bool
    snapshot_max_mb: int

    @property
    def connection(self) -> Connection:
        return Connection(self.login, self.name)


def site_of(profile: str | None) -> Site | None:
    """The profile's login host; None where it names none (the command runs here)."""
    name = profile_name(profile)
    model = load_profile(name)
    if model.login is None:
        return None
    layers = [(Path(src).name, {k: v for k, v in raw.items() if k != "login"}) for src, raw in profile_layers(name)]
    return Site(name, model.login, layers, model.snapshot, model.snapshot_max_mb)


def split_profile(argv: list[str]) -> tuple[str | None, list[str]]:
    """The -p/--profile value and the command line without it."""
    out: list[str] = []
    profile = None
    it = iter(argv)
    for a in it:
        if a in ("-p", "--profile"):
            profile = next(it, None)
        elif a.startswith("--profile="):
            profile = a.split("=", 1)[1]
        elif a.startswith("-p") and len(a) > 2 and not a.startswith("--"):
            profile = a[2:]
        else:
            out.append(a)
    return profile, out


def sweep_submit_spelled_out(argv: list[str]) -> list[str]:
    """`sweep SPEC ...` is `sweep submit SPEC ...` (cli.sweep_cmd), spelled out here to be forwarded."""
    if argv[:1] == ["sweep"] and len(argv) > 1 and not argv[1].startswith("-") and argv[1] not in SWEEP_COMMANDS:
        return ["sweep", "submit", *argv[1:]]
    return argv


def command_of(argv: list[str]) -> str:
    words = [a for a in argv[:2] if not a.startswith("-")]
    return " ".join(words[:2]) if words[:1] == ["sweep"] else (words[0] if words else "")


def forward(argv: list[str]) -> int | None:
    """Run the command on the profile's login host; None when it runs here (no login host, a
    command that is not the cluster's, --help)."""
    profile, rest = split_profile(argv)
    rest = sweep_submit_spelled_out(rest)
    command = command_of(rest)
    if command not in FORWARDED or "--help" in rest:
        return None
    try:
        site = site_of(profile)
    except SlurmkitError:
        return None  # the command itself says what is wrong with the profile
    if site is None:
        return None
    conn = site.connection
    lasting = command == "wait" or (command == "logs" and ("--follow" in rest or "-f" in rest))
    again = command in READ_ONLY and not lasting
    if again:
        conn.open_unless_socket()  # no `ssh -O check` first: a dead master costs one retry below
    else:
        conn.open(interactive=False)  # a command that changes something runs once, on a live master
    if command in ("submit", "resubmit") and "--wait" in rest:
        return _submit_and_wait(site, rest, command)
    if lasting:  # they outlive a dropped connection
        return reconnecting(site, rest, command)
    req, sender = _request(site, rest, command)
    code = run_request(conn, req, sender, tty=command in TERMINAL and sys.stdin.isatty())
    if code == LOST and again and not conn.is_open():  # nothing ran: the master was gone
        conn.open(interactive=False)
        code = run_request(conn, req, sender)
    if code == LOST:
        raise ConnectError(f"the connection to {site.login.destination} was lost", where="profile:login",
                           valid=f"valid: `slurmkit connect -p {site.name}`, then the command again")
    if command == "report" and (targets := _outputs(rest)):
        _fetch(conn, site, req.stage_id, targets)
    return code


def _request(site: Site, argv: list[str], command: str) -> tuple[Request, Any]:
    """The request, and what sends its files (None when none go)."""
    sent: list[tuple[Path, str]] = []
    out: list[str] = []
    positional_seen = False
    it = iter(argv)
    for a in it:
        if a in ("-o", "--output") and command == "report":
            target = next(it, "")
            out += [a, f"{STAGE_PREFIX}out/{Path(target).name}"]
            continue
        if (command in WITH_SPEC and not positional_seen and a != command.split()[-1] and not a.startswith("-")
                and Path(a).is_file()):
            arc = f"files/{len(sent)}-{Path(a).name}"
            sent.append((Path(a), arc))
            a = STAGE_PREFIX + arc
            positional_seen = True
        out.append(a)
    work = _work_listing(site, argv, sent) if command in WITH_SPEC else None
    req = Request("run", argv=out, profile=site.layers, files=bool(sent or work), command=command,
                  slurmkit=__version__, python=platform.python_version())
    if work is not None:
        req.origin = work.origin()
        req.workdir = os.path.relpath(Path.cwd(), work.source)
    return req, (lambda f: _send(f, sent, work)) if req.files else None


def _work_listing(site: Site, argv: list[str], sent: list[tuple[Path, str]]) -> snapshot.Listing | None:
    """The code a snapshot would take, when this submit takes one (the profile's `snapshot`, the
    spec's, or --set snapshot=...)."""
    wanted = site.snapshot
    if sent:
        try:
            value = read_yaml(sent[0][0]).get("snapshot")
        except ConfigError:
            value = None
        wanted = value if isinstance(value, bool) else wanted
    for a, b in zip(argv, argv[1:], strict=False):
        if a == "--set" and b.startswith("snapshot="):
            wanted = b.split("=", 1)[1].lower() in ("true", "1", "yes")
    return snapshot.listing(snapshot.source_of(None), site.snapshot_max_mb) if wanted else None


def _send(stream: Any, sent: list[tuple[Path, str]], work: snapshot.Listing | None) -> None:
    with tarfile.open(fileobj=stream, mode="w|") as tar:
        for path, arc in sent:
            tar.add(path, arcname=arc, recursive=False)
        if work is not None:
            for _, rel in work.sizes:
                tar.add(work.source / rel, arcname=f"work/{rel}", recursive=False)


def serve_argv(login: LoginHost, req: Request, module: str = "slurmkit.cli.serve_command") -> list[str]:
    """The login host's side of a request: its interpreter with -P (never importing from the
    folder it starts in), the entry module, the request as one argument."""
    return [login.python, "-P", "-m", module, req.encode()]


def run_request(conn: Connection, req: Request, sender: Any, tty: bool = False, stdout: IO[bytes] | None = None) -> int:
    """The request on the login host, its output streamed here (or into `stdout`); its exit status."""
    remote = serve_argv(conn.login, req, "slurmkit.api.serve_call" if req.op == "api" else "slurmkit.cli.serve_command")
    proc = subprocess.Popen(conn.ssh_argv(remote, tty), stdin=subprocess.PIPE if sender else None, stdout=stdout)
    if sender is None:
        return proc.wait()
    assert proc.stdin is not None
    try:
        sender(proc.stdin)
    except BrokenPipeError:
        pass  # the far side ended early: its exit status says why
    finally:
        proc.stdin.close()
    return proc.wait()


def _outputs(argv: list[str]) -> dict[str, Path]:
    """report -o FILE: the file's name in the stage's out/, and where it goes here."""
    found = {}
    for a, b in zip(argv, argv[1:], strict=False):
        if a in ("-o", "--output") and b:
            found[Path(b).name] = Path(b)
    return found


def _fetch(conn: Connection, site: Site, stage_id: str, targets: dict[str, Path]) -> None:
    """The command's output files, written here as the command writes them on its own host (never
    through a symlink planted at their names, with the run's modes)."""
    req = Request("fetch", stage_id=stage_id, slurmkit=__version__)
    done = conn.call(serve_argv(site.login, req))
    with tarfile.open(fileobj=io.BytesIO(done.stdout), mode="r|") as tar:
        for member in tar:
            name = Path(member.name).name
            if member.isfile() and name in targets and (f := tar.extractfile(member)) is not None:
                write_output(targets[name], f.read())


def _submit_and_wait(site: Site, argv: list[str], command: str) -> int:
    """submit (or resubmit) --wait as two commands: the submit, whose answer names the run, then
    `wait RUN`, asked again over a reopened connection when it drops."""
    as_json = "--json" in argv
    submit_argv = [a for a in argv if a != "--wait"] + ([] if as_json else ["--json"])
    req, sender = _request(site, submit_argv, command)
    conn = site.connection
    with tempfile.TemporaryFile() as answer:
        code = run_request(conn, req, sender, stdout=answer)
        if code != 0:
            return code
        answer.seek(0)
        sub = json.loads(answer.read())
    if not as_json:
        print(f"run {sub['run_id']}  job {sub['job_id']}  {sub['run_dir']}", flush=True)
    wait_argv = ["wait", sub["run_id"], *(["--json"] if as_json else []),
                 *(["--verbose"] if "--verbose" in argv or "-v" in argv else [])]
    return reconnecting(site, wait_argv, "wait")


def reconnecting(site: Site, argv: list[str], command: str) -> int:
    """`wait RUN` or `logs RUN --follow` on the login host until it ends, reopening a dropped
    connection (up to login.reconnects times). What follow printed before a drop is not printed
    again: the lines asked again are counted off against those already shown (a line may repeat)."""
    conn = site.connection
    shown: Counter[bytes] = Counter()
    for attempt in range(site.login.reconnects + 1):
        req, _ = _request(site, argv, command)
        code = _deduplicated(conn, req, shown) if command == "logs" else run_request(conn, req, None)
        if code != LOST:
            return code
        if attempt == site.login.reconnects:
            break
        time.sleep(RECONNECT_BACKOFF_S[min(attempt, len(RECONNECT_BACKOFF_S) - 1)])
        print(f"slurmkit: the connection to {site.login.destination} dropped; reconnecting", file=sys.stderr)
        try:
            conn.open(interactive=False)
        except ConnectError:
            continue
    raise ConnectError(f"the connection to {site.login.destination} was lost {site.login.reconnects + 1} times; "
                       "the run goes on", where="profile:login.reconnects",
                       valid=f"valid: `slurmkit {command} {argv[1]} -p {site.name}` once it is back")


def _deduplicated(conn: Connection, req: Request, shown: Counter[bytes]) -> int:
    proc = subprocess.Popen(conn.ssh_argv(serve_argv(conn.login, req)), stdout=subprocess.PIPE)
    assert proc.stdout is not None
    again = Counter(shown)
    out = sys.stdout.buffer
    for line in proc.stdout:
        if again[line]:
            again[line] -= 1
            continue
        shown[line] += 1
        out.write(line)
        out.flush()
    return proc.wait()
