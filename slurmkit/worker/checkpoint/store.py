"""Checkpoints over any fsspec URI (through the storage seam, slurmkit.worker.checkpoint.storage): step-N
folders, valid only once their commit marker exists.

Layout: <root>/step-N/<files> and <root>/step-N/COMMITTED.json, written last, holding the checksum
and size of every file. On a local or parallel filesystem every file is written to a temp file in
the same folder, fsynced, renamed, and the folder fsynced (fsspec's local "transaction" does
neither). On an object store (s3://, gs://, az://) each file is one upload, streamed in parts as
torch.save writes it (never whole in memory twice), and the marker is the last; its bucket must
answer when the store is opened (one line says why not), and is never created.
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any, cast

import xxhash
from fsspec.implementations.local import LocalFileSystem

import slurmkit.worker.checkpoint.crc as record_crc
from slurmkit import trust
from slurmkit.common.atomic import atomic_write
from slurmkit.common.layout import OBJECT_STORES
from slurmkit.errors import squash
from slurmkit.jsontypes import JsonObject
from slurmkit.worker.checkpoint.storage import CheckpointError, Storage, open_storage

MARKER = "COMMITTED.json"
TRAINER_FILES = ("model.pt", "optim.pt", "trainer.pt")
"""What a Trainer checkpoint needs to resume: a manifest without all of them is not valid."""
KEEP_MAX_BYTES = 8 << 30  # verified bytes kept for the load that follows; above this, read again
_STEP_RE = re.compile(r"^step-(\d+)$")


SHARDED = "dcp"
"""The manifest's `format` of a sharded step (slurmkit.worker.checkpoint.sharded); absent: one file per name."""
SHARDED_INDEX = ".metadata"
"""DCP's index of a sharded step (which rank's file holds which slice)."""


def trainer_files(parallel: str) -> tuple[str, ...]:
    """What a Trainer checkpoint of this kind (config `parallel`) needs to resume: under fsdp the
    model and optimizer are DCP shards, indexed by SHARDED_INDEX."""
    return ("trainer.pt", SHARDED_INDEX) if parallel == "fsdp" else TRAINER_FILES


DIGEST = "xxh3_128"
"""The manifest's key for each file's checksum (hex)."""


def digest(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def _matches(data: bytes, want: Mapping[str, object]) -> bool:
    """A file's bytes against its manifest entry: size, then the checksum it was written with."""
    if len(data) != want.get("bytes"):
        return False
    if DIGEST in want:
        return digest(data) == want[DIGEST]
    return "sha256" in want and hashlib.sha256(data).hexdigest() == want["sha256"]


class HashingStream(io.RawIOBase):
    """A write stream that checksums what passes through it, for writers that go front to back
    (torch.save, DCP): the checksum is taken as the bytes go out, with no second read."""

    def __init__(self, raw: Any, chunk: int = 0, writeback: bool = False) -> None:
        """chunk: hand `raw` at most this many bytes a write (0: as given), so a client that buffers
        each write whole (s3fs) holds about one part at a time, not a whole tensor.
        writeback: `raw` is a file to be fsynced at the end: each chunk's writeback to the disk starts
        as soon as it is written, so the disk works while the next chunk is copied, and the final fsync
        waits for the last chunk's, not the whole file's (a save's file is not read again soon)."""
        super().__init__()
        self.raw, self.hasher, self.size, self.chunk, self.writeback = raw, xxhash.xxh3_128(), 0, chunk, writeback

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.hasher.update(view)
        self.size += len(view)
        step = self.chunk or len(view) or 1
        for start in range(0, len(view), step):
            self.raw.write(view[start:start + step])
        if self.writeback and len(view) >= WRITEBACK_MIN:
            self.raw.flush()
            # POSIX_FADV_DONTNEED starts the range's writeback (Linux; a hint elsewhere).
            os.posix_fadvise(self.raw.fileno(), self.size - len(view), len(view), os.POSIX_FADV_DONTNEED)
        return len(view)

    def drop_cache(self) -> None:
        """Drop the written file's pages from the page cache, once it is fsynced (clean pages go; dirty
        ones would stay). A checkpoint is not read again soon: the next save writes into pages freed
        here, where fresh ones cost more (on a VM, memory the host has not backed yet: 5x here), and
        the cache keeps what training reads."""
        self.raw.flush()
        os.posix_fadvise(self.raw.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.raw.flush()

    def fileno(self) -> int:
        fileno: int = self.raw.fileno()
        return fileno


WRITEBACK_MIN = 1 << 20
"""Smaller writes (a tensor's header, a small tensor) are left to the final fsync."""

UPLOAD_PART = 16 << 20
"""An object store's upload goes out in parts of this size as torch.save writes (multipart): a
file is never whole in memory a second time, and one killed midway leaves no object."""


@dataclass(frozen=True)
class Entry:
    name: str
    digest: str
    """xxh3-128, hex."""
    bytes: int


def to_bytes(obj: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    with record_crc.off():
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
        self.fs: Storage
        self.fs, root = open_storage(uri)
        self.root = root.rstrip("/")
        self.local = isinstance(self.fs, LocalFileSystem)
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        self.object_store = protocol in OBJECT_STORES
        self.required = required
        self._valid: set[int] = set()  # steps this process committed or verified: their files are final
        self._rejected: set[int] = set()
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

    def step_uri(self, step: int) -> str:
        """step_dir with its protocol (s3://...), for code that opens its own filesystem (DCP's)."""
        uri: str = self.fs.unstrip_protocol(self.step_dir(step))
        return uri

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

    def write_obj(self, step: int, name: str, obj: Any) -> Entry:
        """Write one object of a checkpoint (torch.save'd), atomically as write() does; to an object
        store it is streamed, in parts of UPLOAD_PART, checksummed on the way."""
        if not self.object_store:
            return self.write(step, name, to_bytes(obj))
        import torch

        path = f"{self.step_dir(step)}/{name}"
        self._valid.discard(step)
        try:
            with self.fs.open(path, "wb", block_size=UPLOAD_PART) as raw, record_crc.off():
                stream = HashingStream(raw, chunk=UPLOAD_PART)
                torch.save(obj, cast(IO[bytes], stream))
        except OSError as exc:
            raise CheckpointError(f"checkpoint step {step}: cannot write {name}: {_explain(exc, path)}") from exc
        return Entry(name, stream.hasher.hexdigest(), stream.size)

    def commit(self, step: int, entries: list[Entry], meta: JsonObject | None = None) -> None:
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

    def manifest(self, step: int) -> JsonObject | None:
        try:
            data: JsonObject = json.loads(self.fs.cat_file(f"{self.step_dir(step)}/{MARKER}"))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            return None
        if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
            return None
        return data if all(name in data["files"] for name in self.required) else None

    def committed(self) -> list[int]:
        return [s for s in self.steps() if self.fs.exists(f"{self.step_dir(s)}/{MARKER}")]

    def verify(self, step: int, keep: dict[str, bytes] | None = None) -> JsonObject | None:
        """The manifest if every file exists with its recorded size and checksum, else None.

        With `keep`, the verified bytes are kept there (up to KEEP_MAX_BYTES in all), so loading
        them does not read the files a second time.
        """
        manifest = self.manifest(step)
        if manifest is None:
            return None
        if manifest.get("format") == SHARDED:
            return self._verify_sharded(step, manifest)
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

    def _verify_sharded(self, step: int, manifest: JsonObject) -> JsonObject | None:
        """A sharded step (slurmkit.worker.checkpoint.sharded): every file there with its size, and DCP's index
        checksummed; the shards' checksums are checked at load, each by one rank (one read in all,
        not one per rank)."""
        try:
            sizes = {os.path.basename(i["name"].rstrip("/")): i["size"]
                     for i in self.fs.ls(self.step_dir(step), detail=True)}
        except OSError:
            return None
        files: JsonObject = manifest["files"]
        if any(sizes.get(name) != want.get("bytes") for name, want in files.items()):
            return None
        index = SHARDED_INDEX
        if index not in files or not self.file_matches(step, index, files[index]):
            return None
        self._valid.add(step)
        return manifest

    def file_matches(self, step: int, name: str, want: JsonObject) -> bool:
        """One file of step-N against its manifest entry (size and checksum)."""
        try:
            return _matches(self.fs.cat_file(f"{self.step_dir(step)}/{name}"), want)
        except OSError:
            return False

    def reject(self, step: int) -> None:
        """A step that failed to load (a shard's checksum, found by the rank that checked it) is not
        valid for this process, whatever verify() said: keep_latest_k does not count it."""
        self._valid.discard(step)
        self._rejected.add(step)

    def is_valid(self, step: int) -> bool:
        """verify(), remembered: a step's files never change once committed."""
        return step not in self._rejected and (step in self._valid or self.verify(step) is not None)

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
