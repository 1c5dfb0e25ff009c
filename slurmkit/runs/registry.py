"""Creating run folders on the client: the run root (expanded, its ancestors checked), a new
run id, the private folder, and the first writes that leave nothing behind when they fail.

A run folder's layout is slurmkit.common.layout's (RunPaths); run.json changes only through
slurmkit.common.record's locked editor. Finding and listing runs is slurmkit.runs.lookup's.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from slurmkit import trust
from slurmkit.common import perms
from slurmkit.common.atomic import atomic_write_text
from slurmkit.common.layout import RunPaths, expand_checkpoint_root, expand_root
from slurmkit.errors import ConfigError, SlurmkitError, clip

CREATE_ATTEMPTS = 20


def local_checkpoint_root(checkpoint_root: str | None) -> Path | None:
    """A checkpoint_root on a filesystem path, expanded; None for none or an object store's (whose
    bucket policy is the store's to enforce, docs/security.md)."""
    if not checkpoint_root or ("://" in checkpoint_root and not checkpoint_root.startswith("file://")):
        return None
    return Path(os.path.expanduser(expand_checkpoint_root(checkpoint_root).removeprefix("file://")))


def check_checkpoint_root(checkpoint_root: str | None) -> None:
    """A checkpoint_root on a filesystem path must not let another user swap a run's checkpoint
    folder: the folders down to it (its nearest existing one) writable by others only with the
    sticky bit."""
    if (path := local_checkpoint_root(checkpoint_root)) is None:
        return
    existing = next((p for p in [path, *path.parents] if p.exists()), Path("/"))
    if why := trust.chain_reason(existing):
        raise ConfigError(why, where=f"profile:checkpoint_root={clip(checkpoint_root)}",
                          valid="valid: a folder of your own, or a shared one with the sticky bit (as /tmp)")


ID_RANDOM_BYTES = 4
"""A run id's random part: 8 hex digits after its second, so another user of a shared root cannot
make its folders ahead of the submit (2**32 guesses for each second)."""


def new_run_id(name: str) -> str:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{name}-{stamp}-{secrets.token_hex(ID_RANDOM_BYTES)}"


def claim_checkpoint_folder(checkpoint_root: str | None, run_id: str, run_mode: str) -> Path | None:
    """The run's checkpoint folder under a filesystem checkpoint_root, made private at submit and
    before the run's id is visible in run_root, so no one else can make it first. A folder already
    there that is not the caller's own and private (someone made it first) is one line, and nothing is
    queued. None where checkpoints go elsewhere (the run folder, an object store)."""
    if (root := local_checkpoint_root(checkpoint_root)) is None:
        return None
    folder = root / run_id
    where = f"profile:checkpoint_root={clip(checkpoint_root)}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        perms.make_run_folder(folder, run_mode)
    except FileExistsError:
        trust.check(trust.reason(folder), where, "valid: submit again (a new run id); the folder "
                    f"{folder} was made by someone else, before this submit")
    except OSError as exc:
        raise ConfigError(f"cannot create the checkpoint folder {folder}: {exc.strerror or exc}", where=where,
                          valid="valid: a checkpoint_root you can write") from exc
    return folder


def create(run_root: str, name: str, run_mode: str = perms.PRIVATE,
           checkpoint_root: str | None = None, run_id: str | None = None) -> RunPaths:
    """A new, empty run folder (0700, or 0750+setgid for run_mode group); one clear error if it cannot be.
    A local checkpoint_root others could swap a run's checkpoints in is refused here too. `run_id`:
    the id a dry run chose (its script names the folder), taken as it is; else a fresh one."""
    check_checkpoint_root(checkpoint_root)
    root = expand_root(run_root)
    where = f"profile:run_root={clip(run_root)}"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        # A dangling symlink or a file in the way reads as FileExistsError: say what is there.
        what = "a dangling symlink" if root.is_symlink() and not root.exists() else exc.strerror or str(exc)
        raise ConfigError(f"cannot create the run root: {what}", where=where,
                          valid="valid: a writable folder on a filesystem shared with the compute nodes") from exc
    if not root.is_dir():
        raise ConfigError("the run root is not a folder", where=where, valid="valid: a writable folder")
    if reason := trust.chain_reason(root):
        raise ConfigError(reason, where=where, valid="valid: a folder of your own, in folders only you or root "
                                                     "can write, or shared ones with the sticky bit (as /tmp)")
    for _ in range(1 if run_id else CREATE_ATTEMPTS):  # a clash on the random id is rare; never spin forever
        paths = RunPaths(root / (run_id or new_run_id(name)))
        # The checkpoint folder first: the run folder makes the id visible to other users of run_root.
        checkpoints = claim_checkpoint_folder(checkpoint_root, paths.run_id, run_mode)
        try:
            perms.make_run_folder(paths.run_dir, run_mode)
            return paths
        except FileExistsError:
            _drop_empty(checkpoints)
            continue
        except OSError as exc:
            _drop_empty(checkpoints)
            raise ConfigError(f"cannot create a run folder: {exc.strerror or exc}", where=where,
                              valid="valid: a writable folder with free space") from exc
    raise SlurmkitError(f"run id {run_id} is taken" if run_id else f"no free run id after {CREATE_ATTEMPTS} attempts",
                        where=where, valid="valid: submit again (a new run id)")


def _drop_empty(folder: Path | None) -> None:
    """A checkpoint folder claimed for a submit that did not happen: removed while it is empty."""
    if folder is not None:
        with contextlib.suppress(OSError):
            folder.rmdir()


def discard(paths: RunPaths, checkpoint_root: str | None = None) -> None:
    """A run or sweep folder whose submit queued nothing, removed with its still empty checkpoint folder."""
    shutil.rmtree(paths.run_dir, ignore_errors=True)
    if (root := local_checkpoint_root(checkpoint_root)) is not None:
        for folder in [root / paths.run_id, *root.glob(f"{paths.run_id}.*")]:  # a heterogeneous run's parts' too
            _drop_empty(folder)


@contextmanager
def or_nothing(paths: RunPaths, checkpoint_root: str | None = None) -> Iterator[None]:
    """The first writes into a new folder: on any failure the folder goes (and the run's checkpoint
    folder under checkpoint_root, still empty), and an OSError (full disk, read-only, quota) becomes
    one ConfigError, so a failed submit leaves nothing behind."""
    try:
        yield
    except BaseException as exc:
        discard(paths, checkpoint_root)
        if isinstance(exc, OSError):
            raise ConfigError(f"cannot write {clip(exc.filename or str(paths.run_dir))}: {exc.strerror or exc}",
                              where="profile:run_root", valid="valid: a writable run_root with free space") from exc
        raise


def write_script(paths: RunPaths, text: str) -> None:
    # Not fsynced: run.json, written durably just before, holds the same text as "script".
    atomic_write_text(paths.script, text, perms.file_mode(paths.run_dir), durable=False)
