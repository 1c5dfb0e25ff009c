"""The login side of staging: pack the environment as a submit sends it (or ahead of time, `slurmkit
env pack`), saying what it does on stderr, with a progress line while it packs."""

from __future__ import annotations

import sys
import time

from slurmkit.stage.envpack import EnvImage, Packed, pack

PROGRESS_EVERY_S = 2.0


def pack_said(img: EnvImage) -> Packed:
    """`pack`, with one line when it is done (and progress lines while it runs, every few seconds)."""
    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_EVERY_S:
            last[0] = now
            print(f"slurmkit: packing the environment: {done * 100 // max(total, 1)}% "
                  f"({done >> 20} of {total >> 20} MB)", file=sys.stderr, flush=True)

    packed = pack(img, progress)
    said = ("already packed, reused" if packed.reused else
            f"packed {packed.bytes >> 20} MB in {packed.seconds:.1f} s")
    print(f"slurmkit: stage: environment {img.digest} ({len(img.distributions)} distributions): {said}",
          file=sys.stderr, flush=True)
    return packed
