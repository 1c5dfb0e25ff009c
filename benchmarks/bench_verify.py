"""Restore verification: the checksum time of a checkpoint, a core, against sha256 of the same bytes.

A step of `--gb` GB (incompressible, in files of 256 MiB) is written through CheckpointStore to
`--dir` and verified as a restore verifies it (read, size, checksum). The figure is the checksum's
own time per GB on one core, next to sha256's over the same bytes in the same run (the verification
before 2026-12-04); the goal is <= 0.3 s a GB. Verify's wall time (reads included) is printed too.

    python benchmarks/bench_verify.py [--gb 1] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from slurmkit.worker.checkpoint.store import CheckpointStore, digest  # noqa: E402

FILE = 256 << 20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(dir=args.dir, prefix="bench-verify-"))
    try:
        store = CheckpointStore(str(root / "ck"))
        files = [os.urandom(FILE) for _ in range(max(1, round(args.gb * 1e9 / FILE)))]
        store.commit(1, [store.write(1, f"part{i}.bin", data) for i, data in enumerate(files)])
        total = sum(map(len, files)) / 1e9
        t0 = time.perf_counter()
        for data in files:
            digest(data)
        ours = (time.perf_counter() - t0) / total
        t0 = time.perf_counter()
        for data in files:
            hashlib.sha256(data).hexdigest()
        sha = (time.perf_counter() - t0) / total
        t0 = time.perf_counter()
        assert CheckpointStore(str(root / "ck")).verify(1) is not None
        wall = time.perf_counter() - t0
        print(f"{total:.2f} GB: checksum {ours:.3f} s/GB a core, sha256 {sha:.3f} s/GB -> x{ours / sha:.2f} of "
              f"sha256; verify (reads included) {wall:.2f} s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
