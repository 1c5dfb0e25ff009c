"""All-reduce bandwidth over every rank, as nccl-tests reports it, with a memcpy baseline.

algbw = bytes / time; busbw = algbw x 2(n-1)/n (nccl-tests' all_reduce correction factor),
so busbw is comparable to the link's bandwidth whatever the rank count.
"""

from __future__ import annotations

import time

from slurmkit.jsontypes import JsonObject

MIN_BYTES = 8
MAX_BYTES = 256 * 1024**2
TARGET_BYTES_PER_SIZE = 512 * 1024**2  # iterations shrink as messages grow


def sizes(max_bytes: int = MAX_BYTES, min_bytes: int = MIN_BYTES) -> list[int]:
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= 2
    return out


def busbw(algbw: float, n_ranks: int) -> float:
    return algbw * 2 * (n_ranks - 1) / n_ranks if n_ranks > 1 else algbw


def _iters(size: int) -> int:
    return max(2, min(50, TARGET_BYTES_PER_SIZE // (size * 8)))


def run(max_bytes: int = MAX_BYTES) -> JsonObject:
    """On every rank: time all_reduce per size; rank 0's rows are the result."""
    import torch
    import torch.distributed as tdist

    from slurmkit.worker.process_group import distributed

    with distributed() as dist:
        device = torch.device(dist.device_str)

        def sync() -> None:
            if device.type == "cuda":
                torch.cuda.synchronize()

        rows = []
        for size in sizes(max_bytes):
            n = max(1, size // 4)
            buf = torch.ones(n, dtype=torch.float32, device=device)
            dst = torch.empty_like(buf)
            iters = _iters(size)
            for _ in range(2):  # warm-up: connections, allocations
                if dist.world_size > 1:
                    tdist.all_reduce(buf)
                dst.copy_(buf)
            sync()
            if dist.world_size > 1:
                tdist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                if dist.world_size > 1:
                    tdist.all_reduce(buf)
            sync()
            ar_s = (time.perf_counter() - t0) / iters
            t0 = time.perf_counter()
            for _ in range(iters):
                dst.copy_(buf)
            sync()
            copy_s = (time.perf_counter() - t0) / iters
            if dist.world_size > 1:
                # The slowest rank decides a collective's time.
                t = torch.tensor([ar_s], dtype=torch.float64, device=device)
                tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
                ar_s = float(t.item())
            algbw = n * 4 / ar_s / 1e9
            rows.append({"bytes": n * 4, "iters": iters, "time_us": ar_s * 1e6, "algbw_GBps": algbw,
                         "busbw_GBps": busbw(algbw, dist.world_size), "memcpy_GBps": n * 4 / copy_s / 1e9})
        return {"world_size": dist.world_size, "backend": dist.backend, "rows": rows}
