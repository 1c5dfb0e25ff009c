"""Checkpoints over any fsspec URI: step-N folders, valid only once their commit marker exists.

Layout: <root>/step-N/<files> and <root>/step-N/COMMITTED.json, written last, holding the checksum
and size of every file. On a local or parallel filesystem every file is written to a temp file in
the same folder, fsynced, renamed, and the folder fsynced (fsspec's local "transaction" does
neither). On an object store (s3://, gs://, az://) each file is one upload and the marker is the
last; its bucket must answer when the store is opened (one line says why not), and is never created.
Loads use torch.load(weights_only=True): nothing from a shared filesystem is fully unpickled.
The checksum, xxh3-128, catches accidents (torn, truncated or misplaced files, flipped bits), not
forgers, as sha256 did not either (docs/fault-tolerance.md says why); sha256 manifests still verify.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fsspec
import xxhash
from fsspec.implementations.local import LocalFileSystem

from slurmkit.common import trust
from slurmkit.common.atomic import atomic_write
from slurmkit.common.errors import squash
from slurmkit.common.layout import OBJECT_STORES

MARKER = "COMMITTED.json"
TRAINER_FILES = ("model.pt", "optim.pt", "trainer.pt")
"""What a Trainer checkpoint needs to resume: a manifest without all of them is not valid."""
KEEP_MAX_BYTES = 8 << 30  # verified bytes kept for the load that follows; above this, read again
_STEP_RE = re.compile(r"^step-(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; older committed checkpoints are untouched."""


DIGEST = "xxh3_128"
"""The manifest's key for each file's checksum (hex)."""


def digest(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def _matches(data: bytes, want: dict[str, Any]) -> bool:
    """A file's bytes against its manifest entry: size, then the checksum it was written with."""
    if len(data) != want.get("bytes"):
        return False
    if DIGEST in want:
        return digest(data) == want[DIGEST]
    return "sha256" in want and hashlib.sha256(data).hexdigest() == want["sha256"]


@dataclass(frozen=True)
class Entry:
    name: str
    digest: str
    """xxh3-128, hex."""
    bytes: int


def to_bytes(obj: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def from_bytes(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")


def _explain(exc: OSError, path: str) -> str:
    reason = {errno.ENOSPC: "no space left on device", errno.EACCES: "permission denied",
              errno.EROFS: "read-only filesystem", errno.EDQUOT: "disk quota exceeded"}.get(exc.errno or 0)
    return f"{reason or exc.strerror or exc} ({path})"


class CheckpointStore:
    """Storage only: atomic files, the commit marker, listing, verification, pruning. No collectives."""

    def __init__(self, uri: str, required: tuple[str, ...] = ()) -> None:
        try:
            self.fs, root = fsspec.core.url_to_fs(uri)
        except ImportError as exc:  # fsspec names the package a protocol needs: "Install s3fs to access S3"
            extra = " (pip install 'slurmkit[s3]')" if uri.startswith("s3://") else ""
            raise CheckpointError(f"{uri.split('://')[0]}:// needs a package not installed: {exc}{extra}") from exc
        except ValueError as exc:  # "Protocol not known: nosuch"
            raise CheckpointError(f"{exc}; valid: a folder, file://, s3:// or another fsspec URI") from exc
        self.root = root.rstrip("/")
        self.local = isinstance(self.fs, LocalFileSystem)
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        self.object_store = protocol in OBJECT_STORES
        self.required = required
        self._valid: set[int] = set()  # steps this process committed or verified: their files are final
        if self.local:
            self._claim()
        elif self.object_store:
            self._reach(protocol)

    def _reach(self, protocol: str) -> None:
        """The bucket exists and answers, with this process's credentials: one listing, now, rather
        than a traceback from the first save's thread."""
        bucket = self.root.split("/", 1)[0]
        try:
            self.fs.ls(bucket, detail=False)
        except FileNotFoundError as exc:
            raise CheckpointError(f"bucket {protocol}://{bucket} does not exist; valid: a bucket that exists "
                                  "(slurmkit never creates one)") from exc
        except Exception as exc:  # noqa: BLE001 - botocore's and the other clients' own errors, in one line
            hint = (" (credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, ~/.aws/credentials or an "
                    "instance role; a store other than AWS: AWS_ENDPOINT_URL)") if protocol.startswith("s3") else ""
            raise CheckpointError(f"cannot reach {protocol}://{bucket}: {type(exc).__name__}: "
                                  f"{squash(str(exc), 200)}{hint}") from exc

    def _claim(self) -> None:
        """The checkpoint folder is the run's own: made here by a plain mkdir (0700, or 0750 under a
        group run's umask), or, where it exists, the caller's, no symlink, writable by no one else;
        and no folder above it lets another user swap it (trust.chain_reason). Else one line: a
        folder someone else made first, with their `step-N` in it, is never resumed from."""
        parent = os.path.dirname(self.root) or "/"
        try:
            os.makedirs(parent, exist_ok=True)
            os.mkdir(self.root, 0o777)  # narrowed by the job's umask (0077 or 0027)
        except FileExistsError:
            pass
        except OSError as exc:
            raise CheckpointError(f"cannot create the checkpoint folder: {_explain(exc, self.root)}") from exc
        why = trust.reason(self.root) or trust.chain_reason(parent)
        if why:
            raise CheckpointError(f"refusing the checkpoint folder {self.root}: {why}; valid: a folder of your own, "
                                  "under a checkpoint_root only you (or root) can write, or one with the sticky bit")

    def step_dir(self, step: int) -> str:
        return f"{self.root}/step-{step}"

    # ------------------------------------------------------------------ writing

    def write(self, step: int, name: str, data: bytes) -> Entry:
        """Write one file of a checkpoint atomically; it counts only once the marker names it."""
        folder = self.step_dir(step)
        path = f"{folder}/{name}"
        self._valid.discard(step)
        # Checksum while writing (xxhash releases the GIL on large inputs).
        digests: list[str] = []
        hasher = threading.Thread(target=lambda: digests.append(digest(data)))
        hasher.start()
        try:
            if self.local:
                # 0666 narrowed by the umask: the job's (perms.UMASK) keeps checkpoints off other users.
                atomic_write(path, data, mode=0o666)
            else:
                if not self.object_store:  # a bucket's "folders" are key prefixes; its makedirs would create buckets
                    self.fs.makedirs(folder, exist_ok=True)
                self.fs.pipe_file(path, data)
        except OSError as exc:
            raise CheckpointError(f"checkpoint step {step}: cannot write {name}: {_explain(exc, path)}") from exc
        finally:
            hasher.join()
        return Entry(name, digests[0], len(data))

    def commit(self, step: int, entries: list[Entry], meta: dict[str, Any] | None = None) -> None:
        """Write the marker last: from now on step-N is a valid checkpoint."""
        manifest = {"step": step, "files": {e.name: {DIGEST: e.digest, "bytes": e.bytes} for e in entries},
                    **(meta or {})}
        self.write(step, MARKER, json.dumps(manifest, indent=1, sort_keys=True).encode())
        self._valid.add(step)  # hashed as written; no need to read it back

    # ------------------------------------------------------------------ reading

    def steps(self) -> list[int]:
        """Every step folder present, committed or not, newest first."""
        try:
            names = [os.path.basename(p.rstrip("/")) for p in self.fs.ls(self.root, detail=False)]
        except FileNotFoundError:
            return []
        found = [int(m.group(1)) for n in names if (m := _STEP_RE.match(n))]
        return sorted(found, reverse=True)

    def manifest(self, step: int) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads(self.fs.cat_file(f"{self.step_dir(step)}/{MARKER}"))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            return None
        if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
            return None
        return data if all(name in data["files"] for name in self.required) else None

    def committed(self) -> list[int]:
        return [s for s in self.steps() if self.fs.exists(f"{self.step_dir(s)}/{MARKER}")]

    def verify(self, step: int, keep: dict[str, bytes] | None = None) -> dict[str, Any] | None:
        """The manifest if every file exists with its recorded size and checksum, else None.

        With `keep`, the verified bytes are kept there (up to KEEP_MAX_BYTES in all), so loading
        them does not read the files a second time.
        """
        manifest = self.manifest(step)
        if manifest is None:
            return None
        kept = 0
        for name, want in manifest["files"].items():
            try:
                data = self.fs.cat_file(f"{self.step_dir(step)}/{name}")
            except OSError:
                return None
            if not _matches(data, want):
                return None
            if keep is not None and kept + len(data) <= KEEP_MAX_BYTES:
                keep[name], kept = data, kept + len(data)
        self._valid.add(step)
        return manifest

    def is_valid(self, step: int) -> bool:
        """verify(), remembered: a step's files never change once committed."""
        return step in self._valid or self.verify(step) is not None

    def latest_valid(self, log: Callable[[str], None] | None = None,
                     keep: dict[str, bytes] | None = None, below: int | None = None) -> int | None:
        """The newest checkpoint (older than `below`) whose files all verify; incomplete or corrupt ones are skipped."""
        for step in self.steps():
            if below is not None and step >= below:
                continue
            if keep is not None:
                keep.clear()
            if self.verify(step, keep) is not None:
                return step
            if log:
                log(f"checkpoint step-{step} is incomplete or corrupt; falling back")
        if keep is not None:
            keep.clear()
        return None

    def load(self, step: int, name: str, data: bytes | None = None) -> Any:
        """One file of step-N as tensors (weights_only); `data`: its bytes, already read and verified."""
        return from_bytes(data if data is not None else self.fs.cat_file(f"{self.step_dir(step)}/{name}"))

    def prefetch(self) -> Prefetch:
        """Start finding, reading and verifying the newest valid checkpoint in the background."""
        return Prefetch(self)

    # ------------------------------------------------------------------ pruning

    def prune(self, keep_latest_k: int, protect: tuple[int | None, ...] = ()) -> list[int]:
        """Remove checkpoints older than the k newest VALID ones (a committed but corrupt step does not
        count); never a protected step (the one just committed, the one resumed from)."""
        if keep_latest_k <= 0:
            return []
        valid: list[int] = []
        for step in self.committed():
            if self.is_valid(step):
                valid.append(step)
                if len(valid) == keep_latest_k:
                    break
        if len(valid) < keep_latest_k:
            return []
        removed = [s for s in self.steps() if s < valid[-1] and s not in protect]
        for step in removed:
            folder = self.step_dir(step)
            # The marker goes first, so a half-removed folder is never taken for a checkpoint.
            marker = f"{folder}/{MARKER}"
            if self.fs.exists(marker):
                self.fs.rm(marker)
            self.fs.rm(folder, recursive=True)
        return removed


def cpu_copy(obj: Any, buffers: dict[str, Any] | None = None, _key: str = "") -> Any:
    """A CPU copy of a (nested) state, taken at a step boundary so training may go on.

    With `buffers`, tensors are copied into the memory of an earlier copy taken with the same
    buffers when shapes match: fresh allocations (page faults) cost more than the copy itself. The
    caller keeps a set of buffers out of use while its copy is being written or kept.
    """
    import torch

    if isinstance(obj, torch.Tensor):
        src = obj.detach()
        old = buffers.get(_key) if buffers is not None else None
        if old is not None and old.shape == src.shape and old.dtype == src.dtype:
            return old.copy_(src)
        copy = src.to("cpu", copy=True)
        if buffers is not None:
            buffers[_key] = copy
        return copy
    if isinstance(obj, dict):
        return {k: cpu_copy(v, buffers, f"{_key}/{k}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [cpu_copy(v, buffers, f"{_key}/{i}") for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    return obj


class Prefetch:
    """latest_valid() run in a thread while the process does other start-up work.

    File reads and checksums release the GIL, so on a restart this overlaps with torch.distributed's
    rendezvous and building the model; the verified bytes are then loaded without a second read.
    """

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self.messages: list[str] = []
        self._data: dict[str, bytes] = {}
        self._step: int | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="slurmkit-ckpt-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._step = self.store.latest_valid(self.messages.append, self._data)
        except BaseException as exc:  # raised by result(), in the thread that asks
            self._error = exc

    def result(self) -> tuple[int | None, dict[str, bytes]]:
        """The newest valid step (None: none) and its verified file bytes, by name."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._step, self._data


class AsyncWriter:
    """This rank's share of a save, written in a background thread; at most one save in flight.

    A failure in the background is kept and raised by the next call to `result()`, `wait()` or
    `start()`, so it is never silently lost.
    """

    def __init__(self, store: CheckpointStore, on_file: Callable[[int, str], None] | None = None) -> None:
        """`on_file(step, name)` runs in the writer thread after each file is written (fault injection)."""
        self.store = store
        self.on_file = on_file
        self._thread: threading.Thread | None = None
        self._entries: list[Entry] = []
        self._error: BaseException | None = None
        self.step: int | None = None

    @property
    def pending(self) -> bool:
        return self.step is not None

    @property
    def done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def start(self, step: int, files: dict[str, Any]) -> None:
        self.wait()
        self.step, self._entries, self._error = step, [], None

        def work() -> None:
            try:
                for name, obj in files.items():
                    self._entries.append(self.store.write(step, name, to_bytes(obj)))
                    if self.on_file is not None:
                        self.on_file(step, name)
            except BaseException as exc:  # kept, and raised in the training thread
                self._error = exc

        self._thread = threading.Thread(target=work, name=f"slurmkit-ckpt-{step}", daemon=True)
        self._thread.start()

    def wait(self, heartbeat: Callable[[], None] | None = None) -> None:
        """Join the writer; `heartbeat` is called every second meanwhile (a save is progress)."""
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(1.0)
            if heartbeat is not None:
                heartbeat()

    def abandon(self) -> None:
        """Drop the save in flight, uncommitted (its folder has no marker: never read), once its
        thread is done with the copy; an error it had is dropped with it."""
        self.wait()
        self.step, self._error = None, None

    def result(self, heartbeat: Callable[[], None] | None = None) -> list[Entry]:
        """This rank's entries of the finished save (raising its background error, if any)."""
        self.wait(heartbeat)
        error, self._error = self._error, None
        if error is not None:
            self.step = None
            if isinstance(error, CheckpointError):
                raise error
            raise CheckpointError(f"checkpoint write failed: {error}") from error
        entries = list(self._entries)
        self.step = None
        return entries
