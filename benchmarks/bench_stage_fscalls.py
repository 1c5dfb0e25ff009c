"""File-system calls on the shared environment's paths per node, for one start of a 2-node DDP run
on the dev cluster (cluster), the way a restart starts every rank again: unstaged (the baseline,
every process imports from the environment where it is installed) against staged (profile
stage.env, the node's copy already there, as at a requeue). Counted from outside: strace follows
each node's slurmd, and so every process of the job on that node, the batch step's own Python
included; a call counts where its path is inside the environment (sys.prefix). Also rank 0's
start-up phases (the first step's `startup` record) and sbatch to the first step, both ways.
Goal: <= 100 calls a node staged (issue 63). Needs `slurmkit devcluster up` and strace.

    python benchmarks/bench_stage_fscalls.py [--profile devcluster]
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from slurmkit.common.layout import RunPaths  # noqa: E402
from slurmkit.common.metrics import read_records  # noqa: E402
from slurmkit.devcluster import names  # noqa: E402
from slurmkit.load.loader import resolve  # noqa: E402
from slurmkit.runs import jobs  # noqa: E402
from slurmkit.runs.polling import Poller  # noqa: E402

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_digits.yaml"
SETS = ["resources.nodes=2", "resources.tasks_per_node=1", "config.steps=20"]


def slurmds() -> dict[str, int]:
    daemons = json.loads((names.STATE_DIR / "daemons.json").read_text())["daemons"]
    return {name.removeprefix("slurmd-"): int(pid) for name, pid in daemons.items() if name.startswith("slurmd-")}


def traced(profile: str, root: str, staged: bool, out: Path) -> tuple[dict[str, int], dict[str, float]]:
    """(calls on the environment's paths by node, rank 0's start-up phases) for one run: seconds
    from its process start to the end of each phase, and `submit` from sbatch to its first step."""
    tracers = {node: subprocess.Popen(["strace", "-f", "-qq", "-e", "trace=%file", "-o", str(out / f"{node}.{staged}"),
                                       "-p", str(pid)], stderr=subprocess.DEVNULL)
               for node, pid in slurmds().items()}
    time.sleep(2)  # attached
    t0_wall = time.time()
    sub = jobs.submit(resolve(EXAMPLE, profile, [*SETS, f"profile.run_root={root}",
                                                 f"profile.stage.env={str(staged).lower()}"]))
    paths = RunPaths(Path(sub.run_dir))
    state = jobs.wait(paths, poller=Poller(first_s=0.5, max_s=0.5), timeout_s=900).state
    first = next(r for r in read_records(paths.metrics) if "startup" in r)
    phases = {k: float(v) for k, v in first["startup"].items() if k != "process_start"}
    phases["submit"] = round(float(first["time"]) - t0_wall, 3)
    for tracer in tracers.values():
        tracer.send_signal(signal.SIGINT)
        tracer.wait(60)
    assert state == "COMPLETED", state
    prefix = f'"{sys.prefix}/'
    return {node: sum(prefix in line for line in (out / f"{node}.{staged}").read_text().splitlines())
            for node in tracers}, phases


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", default="devcluster")
    args = parser.parse_args()
    root, out = tempfile.mkdtemp(prefix="bench-stage-"), Path(tempfile.mkdtemp(prefix="bench-stage-trace-"))
    # The staged copy on every node first (a first job unpacks it): what follows is a restart's start.
    jobs.wait(RunPaths(Path(jobs.submit(resolve(EXAMPLE, args.profile, [*SETS, f"profile.run_root={root}",
                                                                         "profile.stage.env=true"])).run_dir)),
              poller=Poller(first_s=0.5, max_s=0.5), timeout_s=900)
    base, base_s = traced(args.profile, root, False, out)
    staged, staged_s = traced(args.profile, root, True, out)
    for node in sorted(base):
        print(f"{node}: {base[node]} calls on {sys.prefix} unstaged, {staged[node]} staged "
              f"(ratio {staged[node] / max(base[node], 1):.4f}; goal: <= 100)")
    for phase in base_s:
        print(f"{phase}: unstaged {base_s[phase]:.2f} s, staged {staged_s.get(phase, 0.0):.2f} s")
    print(f"submit to the first step: staged / unstaged {staged_s['submit'] / base_s['submit']:.2f} "
          "(goal: <= 1.0; under strace, which slows every file call)")


if __name__ == "__main__":
    main()
