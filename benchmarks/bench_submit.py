"""slurmkit's own submit overhead: jobs.submit vs a raw sbatch of the same rendered script."""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from slurmkit.load.loader import resolve
from slurmkit.runs import jobs

REPS = 5


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-submit-"))
    (tmp / "p.yaml").write_text(yaml.safe_dump({"extends": "devcluster", "run_root": str(tmp / "runs")}))
    (tmp / "s.yaml").write_text(yaml.safe_dump({"name": "bench", "command": "true"}))
    ids: list[str] = []
    submit_s, sbatch_s = [], []
    try:
        for _ in range(REPS):
            t0 = time.perf_counter()
            sub = jobs.submit(resolve(tmp / "s.yaml", str(tmp / "p.yaml")))
            submit_s.append(time.perf_counter() - t0)
            ids.append(str(sub.job_id))
            t0 = time.perf_counter()
            out = subprocess.run(["sbatch", "--parsable", str(Path(sub.run_dir) / "sbatch.sh")],
                                 capture_output=True, text=True, check=True).stdout
            sbatch_s.append(time.perf_counter() - t0)
            ids.append(out.strip())
        total, raw = statistics.median(submit_s), statistics.median(sbatch_s)
        print(json.dumps({"reps": REPS, "submit_s": round(total, 3), "raw_sbatch_s": round(raw, 3),
                          "slurmkit_overhead_s": round(total - raw, 3), "ratio_vs_raw_sbatch": round(total / raw, 2)}))
    finally:
        subprocess.run(["scancel", *ids], check=False)


if __name__ == "__main__":
    main()
