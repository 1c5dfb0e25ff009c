"""Startup-hang detection: from a rank's start to its exit when no first step comes, against the
profile's startup_timeout_s plus what the same process takes to start and exit when it does step.

A child process makes the stop object every stepping rank makes (a slurmkit.Checkpoint's, a
framework callback's: the startup watch begins) and never steps; its start-to-exit time, less the
baseline (the same child that steps once, then sleeps the timeout and exits by itself), is the
detection's latency past the timeout. Goal: timeout + <= 5 s (issue 62).

    python benchmarks/bench_startup_hang.py [--timeout 3] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = """
import sys, time
from slurmkit.worker.ft.stop import ScriptStop
script = ScriptStop()
if sys.argv[1] == "steps":
    script.stepped()
time.sleep(float(sys.argv[2]))
"""


def _run(mode: str, timeout_s: float, folder: str) -> tuple[float, int]:
    env = {**os.environ, "SLURMKIT_RUN_DIR": folder, "SLURMKIT_STARTUP_TIMEOUT_S": str(timeout_s),
           "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, mode, str(timeout_s if mode == "steps" else 600)],
                          env=env, capture_output=True, timeout=900)
    return time.perf_counter() - t0, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        hung = [_run("never", args.timeout, folder) for _ in range(args.runs)]
        base = [_run("steps", args.timeout, folder) for _ in range(args.runs)]
    assert all(code == 75 for _, code in hung) and all(code == 0 for _, code in base), (hung, base)
    detect, baseline = statistics.median(t for t, _ in hung), statistics.median(t for t, _ in base)
    print(f"startup timeout {args.timeout:.1f} s: a rank with no first step exits after {detect:.2f} s (median of "
          f"{args.runs}); the same process stepping, then sleeping the timeout: {baseline:.2f} s")
    print(f"detection past the timeout: {detect - baseline:+.2f} s; ratio to the baseline {detect / baseline:.2f}x "
          f"(goal: <= 5 s past it)")


if __name__ == "__main__":
    main()
