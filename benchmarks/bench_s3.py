"""Checkpoint writes to an object store against the client's own upload of the same bytes.

A real S3 server on the loopback address (moto's server mode, tests/s3_server.py: no network, no
account). For each size, `slurmkit bench fs s3://...` writes one checkpoint file through
CheckpointStore (sha256 alongside, no makedirs) and then the same bytes with s3fs's own
`pipe_file`, in the same run; the figure is their ratio (>= 0.9 is the goal).

    python benchmarks/bench_s3.py [--sizes 16MiB,64MiB,256MiB] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from slurmkit.bench import fs as fs_bench  # noqa: E402
from tests.s3_server import BUCKET, serving  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="16MiB,64MiB,256MiB")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with serving("127.0.0.1") as s3:
        os.environ.update(s3.env)
        for text in args.sizes.split(","):
            size = fs_bench.parse_size(text)
            runs = [fs_bench.run(f"s3://{BUCKET}/bench", size) for _ in range(args.repeat)]
            ratio = statistics.median(r["write_vs_put"] for r in runs)
            mbps = statistics.median(r["write_MBps"] for r in runs)
            put = statistics.median(r["put_write_MBps"] for r in runs)
            print(f"{text:>8}: checkpoint write {mbps} MB/s, s3fs put {put} MB/s -> {ratio:.2f}x of the put "
                  f"(median of {args.repeat})", flush=True)


if __name__ == "__main__":
    main()
