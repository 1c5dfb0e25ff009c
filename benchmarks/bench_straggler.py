"""Straggler scoring's cost to a step: what each step pays (its own-work timing: four clock reads
and a deque append), and what a reading every 10 s pays per step (a median of 64, a signed store
set and, on rank 0, one peek a rank), against a small real step measured in the same run (the
digits MLP's forward, backward and AdamW step on CPU, batch 64). Goal: <= 1 % (issue 62).

    python benchmarks/bench_straggler.py [--ranks 64]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import secrets
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from slurmkit.common.ports import free_local_port  # noqa: E402
from slurmkit.worker.ft.straggler import PERIOD_S, OwnTime  # noqa: E402
from slurmkit.worker.signed_store import tcp_store  # noqa: E402


def step_s(n: int = 300) -> float:
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.AdamW(model.parameters())
    x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[50:])


def timing_s(n: int = 200_000) -> float:
    own = OwnTime()
    t0 = time.perf_counter()
    for _ in range(n):
        a = time.perf_counter()
        b = time.perf_counter() - a
        c = time.perf_counter()
        own.add(b + time.perf_counter() - c)
    return (time.perf_counter() - t0) / n


def reading_s(ranks: int, n: int = 20) -> float:
    store = tcp_store("127.0.0.1", free_local_port(), 1, True, dt.timedelta(seconds=30), secrets.token_bytes(32))
    own = OwnTime()
    for i in range(64):
        own.add(0.01 + i * 1e-5)
    for r in range(ranks):
        store.set(f"slurmkit/pace/{r}", json.dumps(["node", 0.01]))
    t0 = time.perf_counter()
    for _ in range(n):
        store.set("slurmkit/pace/0", json.dumps(["node", own.median()]))
        for r in range(ranks):
            store.peek(f"slurmkit/pace/{r}")
    return (time.perf_counter() - t0) / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    base, per_step, reading = step_s(), timing_s(), reading_s(args.ranks)
    steps_a_reading = PERIOD_S / base
    share = (per_step + reading / steps_a_reading) / base
    print(f"a step (digits MLP, CPU): {base * 1e3:.3f} ms; own-work timing {per_step * 1e6:.2f} us a step; a "
          f"reading on rank 0 of {args.ranks} ranks {reading * 1e3:.2f} ms every {PERIOD_S:.0f} s "
          f"({steps_a_reading:.0f} steps)")
    print(f"overhead: {share:.4%} of a step (goal: <= 1 %)")


if __name__ == "__main__":
    main()
