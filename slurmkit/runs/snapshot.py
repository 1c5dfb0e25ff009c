"""Code snapshots: what a requeued incarnation runs is what was submitted.

With `snapshot: true` (profile, spec, or `Executor(snapshot=True)`) the submit copies the code
into the run folder's code/ (RunPaths.code_dir), and the batch shell runs every incarnation from
there: the working directory, and the first entry of PYTHONPATH. What is copied:

- inside a git work tree: every file git tracks, as it is on disk (so uncommitted changes are in),
  plus the untracked files git does not ignore; submodules the same way, recursively. Symlinks
  are copied as links, never followed, so a link to a large data folder costs nothing;
- outside git: the folder of the callable's module (or the working directory).

The copy is bounded by `snapshot_max_mb`, checked before a byte is copied. git runs with a
timeout, so a hung NFS mount is one error line rather than a hung submit.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from slurmkit.common import perms
from slurmkit.errors import ConfigError
from slurmkit.jsontypes import JsonObject

GIT_TIMEOUT_S = 30
MB = 1 << 20
SHOWN_LARGEST = 3
ORIGIN_ENV = "SLURMKIT_SNAPSHOT_ORIGIN"


@dataclass(frozen=True)
class Snapshot:
    """What run.json records of a snapshot (and status --json and the report show)."""

    source: str
    git_commit: str | None
    dirty: bool | None
    files: int
    bytes: int

    def as_dict(self) -> JsonObject:
        return asdict(self)


def _git(folder: Path, *args: str) -> str | None:
    """git's stdout, or None where git is missing or this is not a work tree."""
    try:
        proc = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, timeout=GIT_TIMEOUT_S)
    except FileNotFoundError:
        return None
    except subprocess.TimeoutExpired as exc:
        raise ConfigError(f"git {' '.join(args[:2])} took over {GIT_TIMEOUT_S} s", where=str(folder),
                          valid="valid: a responsive filesystem, or snapshot: false") from exc
    return proc.stdout.decode(errors="surrogateescape") if proc.returncode == 0 else None


def _git_files(top: Path, prefix: str = "") -> list[str]:
    """Tracked plus untracked-but-not-ignored paths under the work tree `top`, submodules included."""
    listed = _git(top, "ls-files", "-z", "--cached", "--others", "--exclude-standard") or ""
    out: list[str] = []
    for rel in dict.fromkeys(p for p in listed.split("\0") if p):
        path = top / rel
        if path.is_dir() and not path.is_symlink():  # a submodule: git lists its folder, not its files
            out += _git_files(path, f"{prefix}{rel}/")
        else:
            out.append(f"{prefix}{rel}")
    return out


def _plain_files(folder: Path) -> list[str]:
    out: list[str] = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d not in ("__pycache__", ".git")]
        out += [os.path.relpath(os.path.join(root, f), folder) for f in files]
    return sorted(out)


def source_of(module_file: str | None) -> Path:
    """The folder to snapshot: the git work tree of the working directory, else the callable's
    module folder, else the working directory. A command forwarded from a laptop runs in the
    code it sent along: that folder, never a git tree around it on the login host."""
    cwd = Path.cwd()
    if ORIGIN_ENV in os.environ:
        return cwd
    top = _git(cwd, "rev-parse", "--show-toplevel")
    if top:
        return Path(top.strip())
    return Path(module_file).resolve().parent if module_file else cwd


@dataclass(frozen=True)
class Listing:
    """What a snapshot of `source` holds: (size, relative path) per file, links counted as 0."""

    source: Path
    in_git: bool
    sizes: list[tuple[int, str]]

    @property
    def total(self) -> int:
        return sum(s for s, _ in self.sizes)

    def origin(self) -> JsonObject:
        """Where the code comes from: its folder, and in git its commit and whether it differs from it."""
        commit = dirty = None
        if self.in_git:
            commit = (_git(self.source, "rev-parse", "HEAD") or "").strip() or None
            status = _git(self.source, "status", "--porcelain", "--untracked-files=no")
            dirty = bool(status and status.strip())
        return {"source": str(self.source), "git_commit": commit, "dirty": dirty}


def listing(source: Path, max_mb: int) -> Listing:
    """The files a snapshot of `source` copies, refused over `max_mb` before a byte is copied."""
    in_git = _git(source, "rev-parse", "--is-inside-work-tree") is not None
    names = _git_files(source) if in_git else _plain_files(source)
    sizes: list[tuple[int, str]] = []
    for rel in names:
        try:
            st = (source / rel).lstat()
        except FileNotFoundError:
            continue  # tracked but deleted on disk: the snapshot is the disk
        sizes.append((0 if (source / rel).is_symlink() else st.st_size, rel))
    found = Listing(source, in_git, sizes)
    if found.total > max_mb * MB:
        largest = ", ".join(f"{rel} ({s / MB:.0f} MB)" for s, rel in sorted(sizes, reverse=True)[:SHOWN_LARGEST])
        raise ConfigError(f"code snapshot of {source} is {found.total / MB:.0f} MB in {len(sizes)} files, over "
                          f"snapshot_max_mb={max_mb}; largest: {largest}", where="profile:snapshot_max_mb",
                          valid="valid: raise snapshot_max_mb, git-ignore data files, or snapshot: false")
    return found


def take(dest: Path, source: Path, max_mb: int) -> Snapshot:
    """Copy the snapshot of `source` into `dest` (which must not exist yet). Where the code came
    from a laptop (slurmkit.remote), $SLURMKIT_SNAPSHOT_ORIGIN says where it came from there."""
    found = listing(source, max_mb)
    kind = perms.folder_kind(dest.parent)
    _folder(dest, kind)
    for _, rel in found.sizes:
        _copy(source / rel, dest / rel, dest, kind)
    origin = json.loads(os.environ[ORIGIN_ENV]) if ORIGIN_ENV in os.environ else found.origin()
    return Snapshot(origin["source"], origin["git_commit"], origin["dirty"], len(found.sizes), found.total)


def _folder(path: Path, kind: str) -> None:
    """A folder of the snapshot, with the run folder's mode (0700, or 2750 for run_mode group)."""
    path.mkdir(mode=0o700)
    os.chmod(path, perms.FOLDER_MODE[kind])


def _copy(src: Path, target: Path, top: Path, kind: str) -> None:
    """One file with the run folder's file mode (0600 or 0640), whatever the source's, keeping only
    its execute bit: a group-writable source must not give a group member a file they can change
    and that runs as the owner on every requeue. A symlink is copied as a link."""
    for folder in reversed([p for p in target.parents if p != top and top in p.parents]):
        if not folder.is_dir():
            _folder(folder, kind)
    if src.is_symlink():
        os.symlink(os.readlink(src), target)
        return
    mode = perms.FILE_MODE[kind]
    if src.stat().st_mode & stat.S_IXUSR:
        mode |= (mode & 0o440) >> 2  # r becomes r-x, for the owner (and the group in a group folder)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as out, open(src, "rb") as inp:
        shutil.copyfileobj(inp, out)
    os.chmod(target, mode)  # the umask narrowed the open's mode; this is the mode meant


def into(run_dir: Path, code_dir: Path, module_file: str | None, max_mb: int) -> JsonObject:
    """Take the run's snapshot into code_dir; what run.json records of it."""
    return take(code_dir, source_of(module_file), max_mb).as_dict() | {"dir": str(code_dir.relative_to(run_dir))}
