"""`slurmkit bench fs URI`: checkpoint-style write and read throughput through fsspec, against `dd`.

The write is exactly a checkpoint's write (CheckpointStore: temp file, 1 MiB writes, fsync, rename,
folder fsync, checksum alongside), in files of at most PART bytes as a sharded checkpoint's, so the
estimate of a save's duration is the real path and the memory it takes is PART, whatever --size.
On a local or parallel filesystem the baseline is `dd bs=1M conv=fsync` into the same folder, in
the same run; on an object store it is the client's own upload (`fs.pipe_file`) of the same bytes.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from slurmkit.errors import SlurmkitError
from slurmkit.jsontypes import JsonObject

_SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?$", re.IGNORECASE)
CHUNK = 1 << 20
PART = 64 * CHUNK


def parse_size(text: str, where: str = "--size") -> int:
    """Bytes, as people and tools write them: 40GB and 256MB are powers of 1000 (what is printed back
    as GB); 512MiB, and bare 256M as dd and Slurm read it, powers of 1024; 4096 is bytes."""
    m = _SIZE_RE.match(text.strip())
    if not m:
        raise SlurmkitError(f"invalid size {text!r}", where=where, valid="valid: e.g. 256MB, 1GB, 512MiB")
    power = " KMGT".index((m.group(2) or " ").upper())
    decimal = (m.group(3) or "").upper() == "B" and power > 0  # "GB", not "GiB" or "G"
    # Exact (no float): 999999999999T is a number of bytes to refuse for its size, not an overflow.
    return int(Decimal(m.group(1)) * (1000 if decimal else 1024) ** power)


def check_size(size: int, where: str = "--size") -> int:
    """At least dd's 1 MiB block: smaller, the run would compare a few bytes with dd's MiB."""
    if size < CHUNK:
        raise SlurmkitError(f"size of {size} bytes is under 1 MiB", where=where,
                            valid="valid: 1MiB or more (dd writes 1 MiB blocks), e.g. 256MB, 1GB")
    return size


def check_free(folder: str, size: int, where: str = "--size") -> None:
    """The bench's file and then dd's fit in the free space of `folder`'s filesystem."""
    free = shutil.disk_usage(folder).free
    if size > free:
        shown = f"{size / 1e9:.3g} GB" if size < 1e30 else "over 1e30 bytes"
        raise SlurmkitError(f"{shown} do not fit in the {free / 1e9:.1f} GB free under {folder}", where=where,
                            valid=f"valid: at most {free // CHUNK}MiB there")


def _dd(folder: str, size: int) -> tuple[float, float]:
    """(write s, read s) of dd on the same folder."""
    path = os.path.join(folder, f".slurmkit-dd-{uuid.uuid4().hex}")
    count = max(1, size // CHUNK)
    try:
        t0 = time.perf_counter()
        subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={count}", "conv=fsync"],
                       capture_output=True, check=True)
        write_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M"], capture_output=True, check=True)
        return write_s, time.perf_counter() - t0
    finally:
        if os.path.exists(path):
            os.unlink(path)


def _timed(store: Any, size: int) -> tuple[float, float, float | None]:
    """(write s, read s, the object store client's own upload s or None) of `size` bytes in parts."""
    block = os.urandom(min(size, PART))  # incompressible, cheap to make; every part is (a slice of) it

    def parts() -> Iterator[tuple[str, bytes]]:
        for i, start in enumerate(range(0, size, PART)):
            n = min(PART, size - start)
            yield f"bench-{i:05d}.bin", block if n == len(block) else block[:n]

    t0 = time.perf_counter()
    for name, data in parts():
        store.write(0, name, data)
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    buf = bytearray(CHUNK)
    for name, _ in parts():
        with store.fs.open(f"{store.step_dir(0)}/{name}", "rb") as f:
            while f.readinto(buf):
                pass
    read_s = time.perf_counter() - t0
    if not store.object_store:
        return write_s, read_s, None
    t0 = time.perf_counter()  # the baseline: the client's own upload of the same bytes, nothing of slurmkit's
    for name, data in parts():
        store.fs.pipe_file(f"{store.root}/raw-{name}", data)
    return write_s, read_s, time.perf_counter() - t0


def run(uri: str, size: int, checkpoint_bytes: int | None = None) -> JsonObject:
    from slurmkit.worker.checkpoint.store import CheckpointError, CheckpointStore

    root = f"{uri.rstrip('/')}/.slurmkit-bench-{uuid.uuid4().hex[:8]}"
    try:
        store = CheckpointStore(root)
    except CheckpointError as exc:
        raise SlurmkitError(f"cannot write or read there: {exc}", where=uri) from exc
    size -= size % CHUNK  # whole MiB: dd writes the same bytes, in 1 MiB blocks
    if store.local:
        check_free(os.path.dirname(store.root), size)
    try:
        write_s, read_s, put_s = _timed(store, size)
    except (OSError, CheckpointError) as exc:
        raise SlurmkitError(f"cannot write or read there: {exc}", where=uri) from exc
    finally:
        with contextlib.suppress(OSError):
            store.fs.rm(store.root, recursive=True)
    out: JsonObject = {"uri": uri, "bytes": size, "write_s": round(write_s, 3), "read_s": round(read_s, 3),
                           "write_MBps": round(size / write_s / 1e6, 1), "read_MBps": round(size / read_s / 1e6, 1)}
    if store.local and shutil.which("dd"):
        dd_write, dd_read = _dd(os.path.dirname(store.root), size)
        out.update(dd_write_MBps=round(size / dd_write / 1e6, 1), dd_read_MBps=round(size / dd_read / 1e6, 1),
                   write_vs_dd=round(dd_write / write_s, 2), read_vs_dd=round(dd_read / read_s, 2))
    elif put_s is not None:
        out.update(put_write_MBps=round(size / put_s / 1e6, 1), write_vs_put=round(put_s / write_s, 2))
    else:
        out.update(baseline="none: dd needs a local or mounted path")
    ckpt = checkpoint_bytes or size
    out.update(checkpoint_bytes=ckpt, estimated_save_s=round(ckpt / (size / write_s), 2))
    return out
