"""`slurmkit bench fs URI`: checkpoint-style write and read throughput through fsspec, against `dd`.

The write is exactly a checkpoint file's write (CheckpointStore: temp file, 1 MiB writes, fsync,
rename, folder fsync, checksum alongside), so the estimate of a save's duration is the real path.
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
from typing import Any

from slurmkit.common.errors import SlurmkitError

_SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?$", re.IGNORECASE)
CHUNK = 1 << 20


def parse_size(text: str, where: str = "--size") -> int:
    """Bytes, as people and tools write them: 40GB and 256MB are powers of 1000 (what is printed back
    as GB); 512MiB, and bare 256M as dd and Slurm read it, powers of 1024; 4096 is bytes."""
    m = _SIZE_RE.match(text.strip())
    if not m:
        raise SlurmkitError(f"invalid size {text!r}", where=where, valid="valid: e.g. 256MB, 1GB, 512MiB")
    power = " KMGT".index((m.group(2) or " ").upper())
    decimal = (m.group(3) or "").upper() == "B" and power > 0  # "GB", not "GiB" or "G"
    return int(float(m.group(1)) * (1000 if decimal else 1024) ** power)


def check_size(size: int, where: str = "--size") -> int:
    """At least dd's 1 MiB block: smaller, the run would compare a few bytes with dd's MiB."""
    if size < CHUNK:
        raise SlurmkitError(f"size of {size} bytes is under 1 MiB", where=where,
                            valid="valid: 1MiB or more (dd writes 1 MiB blocks), e.g. 256MB, 1GB")
    return size


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
    size -= size % CHUNK  # whole MiB: dd writes the same bytes, in 1 MiB blocks
    block = os.urandom(min(size, 64 * CHUNK))  # incompressible, cheap to make
    data = (block * (size // len(block) + 1))[:size]
    put_s = None
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
        if store.object_store:  # the baseline: the client's own upload of the same bytes, nothing of slurmkit's
            t0 = time.perf_counter()
            store.fs.pipe_file(f"{store.root}/raw-put.bin", data)
            put_s = time.perf_counter() - t0
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
    elif put_s is not None:
        out.update(put_write_MBps=round(size / put_s / 1e6, 1), write_vs_put=round(put_s / write_s, 2))
    else:
        out.update(baseline="none: dd needs a local or mounted path")
    ckpt = checkpoint_bytes or size
    out.update(checkpoint_bytes=ckpt, estimated_save_s=round(ckpt / (size / write_s), 2))
    return out


