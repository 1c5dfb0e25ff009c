"""torch.save's CRC-32 of each record, off while slurmkit writes a checkpoint with it.

Every file of a checkpoint is checksummed as it is written (xxh3-128 in the stream,
ckptstore.HashingStream) and checked against the commit marker before it is loaded, so the zip
format's own CRC-32 of each record, which torch.save computes by default, checks nothing more. It
cost about a tenth of a sharded save here (benchmarks/README.md). torch.load reads records without
one; a zip tool would warn.

torch's switch is process-wide, so a torch.save of the script's own in another thread, while a
checkpoint is being written, writes its records without the CRC too. Overlapping writes (the writer
thread's and a stop's) share one switch: it is turned off by the first and restored by the last.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_writers = 0
_before = True


@contextmanager
def off() -> Iterator[None]:
    """torch.save computes no CRC-32 of its records in this block (in any thread of the process)."""
    global _writers, _before
    # torch is imported where a checkpoint is written, never on the login side, which imports ckptstore.
    from torch import serialization  # noqa: PLC0415

    with _lock:
        if _writers == 0:
            _before = serialization.get_crc32_options()
            serialization.set_crc32_options(False)
        _writers += 1
    try:
        yield
    finally:
        with _lock:
            _writers -= 1
            if _writers == 0:
                serialization.set_crc32_options(_before)
