"""A Lightning script's median step under slurmkit (a `command:` on 2 nodes, slurmkit's callback in
every Trainer: its agreed-stop all-reduce after each batch, its metrics forwarding) against the same
script under a plain `sbatch` + `srun` on the same 2 nodes (the usual MASTER_ADDR line, and the
dev cluster profile's OMP_NUM_THREADS), alternating in one run (cluster).

pytorch-lightning is installed from the package index into a folder of its own, as the tests do.
Each job's step times come from rank 0's lines (tests/user_code/lightning_toy.py prints a time
with every step); the first 20 steps of each job (warm-up) are left out.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from slurmkit.common.layout import RunPaths
from slurmkit.load.loader import resolve
from slurmkit.runs import jobs
from tests.conftest import LIGHTNING, USER_CODE, pip_target

PAIRS, STEPS, WARMUP = 3, 300, 20
SCRIPT = USER_CODE / "lightning_toy.py"
PLAIN = """#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --partition=debug --time=10 --output={out}
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export PYTHONPATH={lib} MASTER_ADDR MASTER_PORT={port} OMP_NUM_THREADS=1
srun {python} {script} --steps {steps} --nodes 2 --root {root}
"""


def step_times(log: str) -> list[float]:
    times = [float(t) for t in re.findall(r"rank=0 step=\d+ loss=\S+ t=([\d.]+)", log)]
    return [b - a for a, b in zip(times[WARMUP:], times[WARMUP + 1:], strict=False)]


def wait_job(job_id: str) -> None:
    while subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True).stdout.strip():
        time.sleep(1)


def under_slurmkit(tmp: Path, lib: Path, n: int) -> list[float]:
    spec = tmp / f"s{n}.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "lit", "resources": {"nodes": 2, "tasks_per_node": 1, "time": "00:10:00"},
        "command": f"python {SCRIPT} --steps {STEPS} --nodes 2 --root {tmp / f'sk{n}'}",
        "env": {"PYTHONPATH": str(lib)}}))
    sub = jobs.submit(resolve(spec, str(tmp / "p.yaml")))
    wait_job(str(sub.job_id))
    return step_times(RunPaths(Path(sub.run_dir)).rank_log(str(sub.job_id), 0).read_text())


def under_sbatch(tmp: Path, lib: Path, n: int) -> list[float]:
    out = tmp / f"plain{n}.out"
    script = tmp / f"plain{n}.sh"
    script.write_text(PLAIN.format(out=out, lib=lib, port=29400 + n, python=sys.executable, script=SCRIPT,
                                   steps=STEPS, root=tmp / f"plain{n}"))
    job_id = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True,
                            check=True).stdout.strip()
    wait_job(job_id)
    return step_times(out.read_text())


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-lightning-"))
    (tmp / "p.yaml").write_text(yaml.safe_dump({"extends": "devcluster", "run_root": str(tmp / "runs"),
                                                "requeue": {"standby": False}}))
    lib = pip_target(tmp / "lightning", LIGHTNING)
    ours: list[float] = []
    plain: list[float] = []
    for n in range(PAIRS):  # alternating, so a busy minute weighs on both
        ours += under_slurmkit(tmp, lib, n)
        plain += under_sbatch(tmp, lib, n)
    mine, base = statistics.median(ours), statistics.median(plain)
    print(json.dumps({"pairs": PAIRS, "steps_timed": [len(ours), len(plain)], "median_step_s": round(mine, 5),
                      "plain_sbatch_median_step_s": round(base, 5), "ratio_vs_plain_sbatch": round(mine / base, 3)}))


if __name__ == "__main__":
    main()
