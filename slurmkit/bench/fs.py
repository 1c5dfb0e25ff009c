"""`slurmkit bench fs URI`: checkpoint-style write and read throughput through fsspec, against `dd`.

The write is exactly a checkpoint file's write (CheckpointStore: temp file, 1 MiB writes, fsync,
rename, folder fsync, sha256 alongside), so the estimate of a save's duration is the real path.
On a local or parallel filesystem the baseline is `dd bs=1M conv=fsync` into the same folder, in
the same run; an object store has no dd baseline.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
import uuid
from typing import Any

from slurmkit.common.errors import SlurmkitError

_SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?$", re.IGNORECASE)
CHUNK = 1 << 20


def parse_size(text: str) -> int:
    """'1GB', '256M', '512MiB', '4096' -> bytes (powers of 1024)."""
    m = _SIZE_RE.match(text.strip())
    if not m:
        raise SlurmkitError(f"invalid size {text!r}", where="--size", valid="valid: e.g. 256MB, 1GB, 4096")
    scale = 1024 ** " KMGT".index((m.group(2) or " ").upper())
    return int(float(m.group(1)) * scale)


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


def run(uri: str, size: int, checkpoint_bytes: int | None = None) -> dict[str, Any]:
    from slurmkit.worker.ckptstore import CheckpointError, CheckpointStore

    root = f"{uri.rstrip('/')}/.slurmkit-bench-{uuid.uuid4().hex[:8]}"
    try:
        store = CheckpointStore(root)
    except CheckpointError as exc:
        raise SlurmkitError(f"cannot write or read there: {exc}", where=uri) from exc
    data = os.urandom(min(size, 64 * CHUNK)) * max(1, size // (64 * CHUNK))  # incompressible, cheap to make
    size = len(data)
    try:
        t0 = time.perf_counter()
        store.write(0, "bench.bin", data)
        write_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        buf = bytearray(CHUNK)
        with store.fs.open(f"{store.step_dir(0)}/bench.bin", "rb") as f:
            while f.readinto(buf):
                pass
        read_s = time.perf_counter() - t0
    except (OSError, CheckpointError) as exc:
        raise SlurmkitError(f"cannot write or read there: {exc}", where=uri) from exc
    finally:
        with contextlib.suppress(OSError):
            store.fs.rm(store.root, recursive=True)
    out: dict[str, Any] = {"uri": uri, "bytes": size, "write_s": round(write_s, 3), "read_s": round(read_s, 3),
                           "write_MBps": round(size / write_s / 1e6, 1), "read_MBps": round(size / read_s / 1e6, 1)}
    if store.local and shutil.which("dd"):
        dd_write, dd_read = _dd(os.path.dirname(store.root), size)
        out.update(dd_write_MBps=round(size / dd_write / 1e6, 1), dd_read_MBps=round(size / dd_read / 1e6, 1),
                   write_vs_dd=round(dd_write / write_s, 2), read_vs_dd=round(dd_read / read_s, 2))
    else:
        out.update(baseline="none: dd needs a local or mounted path")
    ckpt = checkpoint_bytes or size
    out.update(checkpoint_bytes=ckpt, estimated_save_s=round(ckpt / (size / write_s), 2))
    return out


