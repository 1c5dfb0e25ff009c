"""The ranks' Python environment, packed once for the nodes' local disks (profile `stage.env`).

What is packed: the environment slurmkit runs in (sys.prefix: a virtual environment, or a conda
one with its interpreter inside), every installed package with it, and slurmkit's own package
where it is an editable checkout. Not the base interpreter of a virtual environment: it must be on
a node-local path already (/usr, a node image); one on a shared filesystem is refused in one line.

Its identity is the interpreter's version, the distributions and their versions, and every file
of the environment (path, size, modification time; __pycache__ left out, as imports write it):
the image is named by that hash (env-HASH.tar.zst), so an unchanged environment is never packed
twice and a changed one never reuses an old image. It is a zstd tar written next to the run
folders (profile run_root: a filesystem every node reads), to a temporary name renamed into place
once whole, with its SHA-256 beside it: a node checks it before unpacking (templates/partials/
stage_node.sh.j2), so a half-written or corrupt image is never used.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from slurmkit import trust
from slurmkit.errors import SlurmkitError
from slurmkit.jsontypes import JsonObject

STORE = ".slurmkit-envs"
"""The images' folder under the profile's run_root (private)."""
SHARED_FS = {"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cephfs", "ceph", "cifs", "smb3", "panfs", "wekafs",
             "fuse.glusterfs", "fuse.sshfs", "9p", "virtiofs"}
SKIP = frozenset({"__pycache__"})
"""Left out of the identity (imports write them); packed all the same, so the nodes compile nothing."""


class StageError(SlurmkitError):
    """An environment that cannot be staged: one line, where and what would do."""


@dataclass(frozen=True)
class EnvImage:
    """An environment as it would be packed: its content hash and where its image lives."""

    prefix: Path
    digest: str
    image: Path
    python: str
    """The interpreter, relative to the environment's root (bin/python)."""
    version: str
    distributions: dict[str, str]
    editable: tuple[tuple[Path, str], ...] = ()
    """(a package folder, its place in the image): slurmkit's own editable checkout."""
    left_out: tuple[str, ...] = field(default=())
    """Files in the environment that point outside it, left out of the image (slurmkit's own .pth)."""

    @property
    def sha_file(self) -> Path:
        return self.image.with_name(self.image.name + ".sha256")

    def record(self) -> JsonObject:
        """What run.json keeps of the environment the ranks ran in."""
        return {"hash": self.digest, "python": self.version, "distributions": self.distributions}


@dataclass(frozen=True)
class Packed:
    image: EnvImage
    seconds: float
    bytes: int
    reused: bool
    """The image was there already: nothing was packed."""


def _fs_type(path: Path) -> str:
    """The filesystem type /proc/mounts gives for `path` (its longest mount point)."""
    best, kind = "", ""
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        parts = line.split()
        if len(parts) > 2:
            mount = parts[1].replace("\\040", " ")
            if (str(path) == mount or str(path).startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                best, kind = mount, parts[2]
    return kind


def identify(run_root: Path, executable: str | None = None, prefix: Path | None = None) -> EnvImage:
    """This interpreter's environment (or the one at `prefix`) as it would be staged (nothing
    written); StageError where it cannot be."""
    exe = Path(executable or sys.executable)
    if executable and Path(executable).resolve() != Path(sys.executable).resolve():
        raise StageError(f"the profile's python ({executable}) is not the interpreter slurmkit runs in",
                         where="profile.stage.env",
                         valid="valid: submit with the interpreter the ranks run, or unset profile.python")
    prefix = prefix or Path(sys.prefix)
    if str(prefix) in ("/", "/usr", "/usr/local"):
        raise StageError(f"{prefix} is the system's Python, not an environment of its own", where="profile.stage.env",
                         valid="valid: run slurmkit from a virtual environment (python -m venv) or a conda one")
    base = Path(sys.base_prefix)
    if base != prefix and (kind := _fs_type(base)) in SHARED_FS:
        raise StageError(f"the environment's base interpreter {base} is on a shared filesystem ({kind})",
                         where="profile.stage.env",
                         valid="valid: a virtual environment made from a node-local Python (/usr/bin/python3, the "
                               "node image's), or a conda environment (its interpreter is packed with it)")
    site = Path(sysconfig.get_paths(vars={"base": str(prefix), "platbase": str(prefix)})["purelib"])
    editable, left_out = _editables(prefix, site)
    dists = {str(d.metadata["Name"]): d.version for d in metadata.distributions(path=[str(site)])
             if d.metadata["Name"]}
    version = ".".join(map(str, sys.version_info[:3]))
    h = hashlib.sha256(json.dumps([version, str(prefix), sorted(dists.items())]).encode())
    for root, dest in ((prefix, ""), *editable):
        for path, st in _files(root):
            h.update(f"{dest}/{path.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    digest = h.hexdigest()[:20]
    store = run_root / STORE
    return EnvImage(prefix, digest, store / f"env-{digest}.tar.zst", str(exe.relative_to(prefix)) if
                    exe.is_relative_to(prefix) else "bin/python", version, dists, editable, left_out)


def _editables(prefix: Path, site: Path) -> tuple[tuple[tuple[Path, str], ...], tuple[str, ...]]:
    """Editable installs: slurmkit's own checkout is packed as its package; any other one outside
    the environment is refused (the nodes would read it from where it was installed)."""
    own = Path(__file__).resolve().parent.parent  # slurmkit's own package
    editable: list[tuple[Path, str]] = []
    left_out: list[str] = []
    for pth in sorted(site.glob("*.pth")):
        for line in pth.read_text(errors="replace").splitlines():
            line = line.strip()
            if not line or line.startswith(("#", "import")):
                continue
            target = Path(line)
            if not target.is_absolute() or target.resolve().is_relative_to(prefix.resolve()):
                continue
            if target.resolve() == own.parent:
                editable.append((own, f"{site.relative_to(prefix)}/slurmkit"))
                left_out.append(str(pth.relative_to(prefix)))
                continue
            raise StageError(f"{pth.name} installs {target} in editable mode, outside the environment",
                             where="profile.stage.env",
                             valid="valid: install it non-editable (pip install PATH), or into the environment")
    for finder in site.glob("__editable__*finder.py"):
        raise StageError(f"{finder.name}: an editable install whose code stays outside the environment",
                         where="profile.stage.env", valid="valid: install it non-editable (pip install PATH)")
    return tuple(editable), tuple(left_out)


def _files(root: Path, skip: frozenset[str] = SKIP) -> Iterator[tuple[Path, os.stat_result]]:
    """Every file and link under `root` (not following links), in a stable order, `skip` left out."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip)
        for name in sorted(filenames):
            path = Path(dirpath, name)
            yield path, path.lstat()


def pack(img: EnvImage, progress: Callable[[int, int], None] | None = None) -> Packed:
    """The image, packed where it is missing (0 s where it is there and whole); StageError where the
    tools or the room are missing. `progress(done_bytes, total_bytes)` as it goes."""
    t0 = time.monotonic()
    store = trust.private_folder(img.image.parent, "the profile's run_root", "the packed environments")
    if img.image.exists() and img.sha_file.exists():
        return Packed(img, time.monotonic() - t0, img.image.stat().st_size, reused=True)
    if shutil.which("zstd") is None:
        raise StageError("zstd is not installed on this host", where="profile.stage.env",
                         valid="valid: install zstd (apt install zstd), or set stage.env: false")
    members = [(path, f"{dest or '.'}/{path.relative_to(root)}", st.st_size)
               for root, dest in ((img.prefix, ""), *img.editable)
               for path, st in _files(root, frozenset()) if str(path.relative_to(root)) not in img.left_out]
    total = sum(size for _, _, size in members)
    partial = store / f".{img.image.name}.{os.getpid()}.partial"
    try:
        _write(partial, members, total, progress)
        sha = hashlib.sha256()
        with partial.open("rb") as fh:
            while chunk := fh.read(1 << 22):
                sha.update(chunk)
        partial.rename(img.image)
        fd = os.open(img.sha_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(sha.hexdigest() + "\n")
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise StageError(f"cannot write the image: {exc.strerror or exc}", where=str(store),
                         valid="valid: a run_root with room for the environment (about half its size)") from None
    return Packed(img, time.monotonic() - t0, img.image.stat().st_size, reused=False)


def _write(partial: Path, members: list[tuple[Path, str, int]], total: int,
           progress: Callable[[int, int], None] | None) -> None:
    """A tar of `members` (path, name in the image, size) through zstd (all cores) into `partial`."""
    with partial.open("wb") as out:
        os.chmod(partial, 0o600)
        zstd = subprocess.Popen(["zstd", "-q", "-T0", "-3", "-c"], stdin=subprocess.PIPE, stdout=out)
        assert zstd.stdin is not None
        done = 0
        try:
            with tarfile.open(fileobj=zstd.stdin, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for path, arcname, size in members:
                    tar.add(path, arcname=arcname, recursive=False)
                    done += size
                    if progress is not None:
                        progress(done, total)
        finally:
            zstd.stdin.close()
            if zstd.wait() != 0:
                raise OSError(f"zstd exited {zstd.returncode}")
