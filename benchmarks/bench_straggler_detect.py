"""Straggler detection at a 3x slowdown on the dev cluster (cluster): from the start of a SIGSTOP/
SIGCONT duty cycle on rank 1 (20 ms stopped of every 30) to `slurmkit status` naming it, at the
default reading period, against the least it can take: three readings (3 x PERIOD_S). Goal: <= 60 s
(issue 62). Needs `slurmkit devcluster up`.

    python benchmarks/bench_straggler_detect.py [--profile devcluster]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from slurmkit.common.layout import RunPaths  # noqa: E402
from slurmkit.common.metrics import read_records  # noqa: E402
from slurmkit.devcluster import ranks  # noqa: E402
from slurmkit.load.loader import resolve  # noqa: E402
from slurmkit.runs import jobs  # noqa: E402
from slurmkit.worker.ft.straggler import PERIOD_S, READINGS  # noqa: E402

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_gpt.yaml"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", default="devcluster")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="bench-straggler-")
    sets = ["resources.nodes=2", "resources.tasks_per_node=1", "config.steps=100000", "config.batch_size=64",
            "config.log_every=1", f"profile.run_root={root}"]
    sub = jobs.submit(resolve(EXAMPLE, args.profile, sets))
    paths = RunPaths(Path(sub.run_dir))
    while not (paths.metrics.exists() and read_records(paths.metrics)):
        time.sleep(0.5)
    pid = ranks.rank_pid(paths, 1)
    t0 = time.monotonic()
    try:
        while not jobs.run_state(paths).stragglers:
            for _ in range(100):
                os.kill(pid, signal.SIGSTOP)
                time.sleep(0.02)
                os.kill(pid, signal.SIGCONT)
                time.sleep(0.01)
        spent = time.monotonic() - t0
        (named,) = jobs.run_state(paths).stragglers
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        jobs.cancel(paths)
    least = READINGS * PERIOD_S
    print(f"rank {named['rank']} on {named['node']} named at score {named['score']:.2f} after {spent:.1f} s of a "
          f"3x slowdown; the least it can take ({READINGS} readings of {PERIOD_S:.0f} s): {least:.0f} s, "
          f"ratio {spent / least:.2f} (goal: <= 60 s)")


if __name__ == "__main__":
    main()
