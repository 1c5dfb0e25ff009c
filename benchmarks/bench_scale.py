"""Scale (cluster, root): sweeps of 1k, 10k and 100k tasks really submitted to the dev cluster, then
`sweep status` and `sweep results` over 100k tasks, and `slurmkit status` over 10,000 runs.

The dev cluster is restarted (purged) with MaxArraySize=10001 and MaxJobCount=200000, and back
to its defaults (purged again) at the end. Every sweep depends on a held job, so nothing runs; all is cancelled after.
Prints one JSON line:

- own_submit_s: slurmkit's own time for the 100k submit, time inside Slurm commands (sbatch,
  pre-flight) excluded, both measured here; own_submit_s_per_1k at 1k, 10k and 100k;
- status_s with squeue_calls/sacct_calls for the 100k sweep; status_parse_ratio: parsing its squeue
  output vs a bare `str.split` loop over the same text;
- results_s: `sweep results --json` of 100k tasks, streamed to /dev/null;
- runs_status_s for 10,000 runs; runs_status_ratio vs a bare `json.load` loop over their run.json;
- peak_rss_mb of this process, which did all of the above.

    sudo python benchmarks/bench_scale.py
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import resource
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from submitit.core import utils

from slurmkit.slurm import commands

SIZES = (1_000, 10_000, 100_000)
MAX_ARRAY_SIZE = 10_001
MAX_JOB_COUNT = 200_000
RUNS = 10_000


class SlurmTime:
    """Seconds spent inside Slurm commands (submitit's sbatch, and slurmkit's own calls) and sbatch calls."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.sbatch = 0

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        original_sbatch, original_call = utils.CommandFunction.__call__, commands.call

        def sbatch(inner: Any, *args: Any, **kwargs: Any) -> Any:
            self.sbatch += 1
            return self._timed(original_sbatch, inner, *args, **kwargs)

        setattr(utils.CommandFunction, "__call__", sbatch)  # noqa: B010 - mypy refuses a method assignment
        setattr(commands, "call", lambda *a, **k: self._timed(original_call, *a, **k))  # noqa: B010
        try:
            yield
        finally:
            setattr(utils.CommandFunction, "__call__", original_sbatch)  # noqa: B010
            setattr(commands, "call", original_call)  # noqa: B010

    def _timed(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0


def submit(tmp: Path, profile: Path, n: int, after: str) -> tuple[Any, float, int]:
    """One sweep of n `true` tasks (env grid), waiting on `after`: (submitted, own seconds, sbatch calls)."""
    from slurmkit.sweeps import spec
    from slurmkit.sweeps import submit as sub

    path = tmp / f"sweep-{n}.yaml"
    path.write_text(yaml.safe_dump({"name": f"scale{n}", "command": "true", "resources": {"time": "00:05:00"},
                                    "sweep": {"grid": {"env.A": list(range(n // 100)), "env.B": list(range(100))}}}))
    slurm = SlurmTime()
    t0 = time.perf_counter()
    with slurm.installed():
        done = sub.submit(spec.load(path), str(profile), after=after)
    return done, time.perf_counter() - t0 - slurm.seconds, slurm.sbatch


def bare_split(text: str) -> float:
    t0 = time.perf_counter()
    fields = 0
    for line in text.splitlines():
        fields += len(line.split("|"))
    return time.perf_counter() - t0


def status(sweep_dir: str) -> dict[str, Any]:
    from slurmkit.common.sweep_layout import SweepPaths
    from slurmkit.slurm import parse
    from slurmkit.sweeps import results

    paths = SweepPaths(Path(sweep_dir))
    t0 = time.perf_counter()
    with commands.counting() as calls:
        states = results.task_states(paths)
    status_s = time.perf_counter() - t0
    text = commands.run(["squeue", "--me", "--noheader", "--array", "--states=all",
                         f"--format={parse.SQUEUE_FORMAT}"])
    t0 = time.perf_counter()
    parsed = parse.squeue(text)
    parse_s = time.perf_counter() - t0
    split_s = bare_split(text)
    from slurmkit.cli.common import print_json_list

    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()) as sink:
        print_json_list(results.iter_rows(paths))
    results_s = time.perf_counter() - t0
    return {"status_tasks": len(states), "status_s": round(status_s, 3), "squeue_calls": calls["squeue"],
            "sacct_calls": calls["sacct"], "status_states": results.counts(states),
            "status_parse_ratio": round(parse_s / split_s, 2), "squeue_rows": len(parsed),
            "results_s": round(results_s, 3), "results_json_mb": round(len(sink.getvalue()) / 1e6, 1)}


def runs_status(tmp: Path, job_ids: list[str]) -> dict[str, Any]:
    """10,000 runs, each holding one of the sweep's (pending) array task ids."""
    from slurmkit.common.layout import RunPaths
    from slurmkit.common.record import RunFile, RunRecord
    from slurmkit.runs import jobs

    root = tmp / "many-runs"
    for i in range(RUNS):
        run_id = f"many-20261201-120000-{i:04x}"  # the shape of a real run id (name-stamp-hex)
        RunFile(RunPaths(root / run_id)).create(RunRecord(
            run_id=run_id, name="many", executor="slurm", job_ids=[job_ids[i]], created="2026-12-01T12:00:00"))
    t0 = time.perf_counter()
    with commands.counting() as calls:
        rows = jobs.status(str(root))
    runs_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for d in root.iterdir():
        with open(d / "run.json") as f:
            json.load(f)
    bare = time.perf_counter() - t0
    assert len(rows) == RUNS
    return {"runs": RUNS, "runs_status_s": round(runs_s, 3), "runs_status_ratio": round(runs_s / bare, 2),
            "runs_squeue_calls": calls["squeue"], "runs_sacct_calls": calls["sacct"]}


def main() -> None:
    from slurmkit.devcluster import cluster as dc
    from slurmkit.devcluster import names

    # Purged: ended jobs of an earlier run still count against MaxJobCount for MinJobAge seconds.
    dc.up(2, log=lambda m: None, purge=True,
          variant=names.Variant(max_array_size=MAX_ARRAY_SIZE, max_job_count=MAX_JOB_COUNT))
    tmp = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    profile = tmp / "p.yaml"
    profile.write_text(yaml.safe_dump({"extends": "devcluster", "run_root": str(tmp / "runs")}))
    blocker = commands.run(["sbatch", "--parsable", "--hold", "--wrap", "true"]).strip()
    submitted: list[Any] = []
    out: dict[str, Any] = {}
    try:
        per_1k = {}
        for n in SIZES:
            done, own, sbatches = submit(tmp, profile, n, f"afterok:{blocker}")
            submitted.append(done)
            per_1k[str(n)] = round(own / n * 1000, 4)
            assert sbatches == math.ceil(n / MAX_ARRAY_SIZE), (n, sbatches)
            if n == SIZES[1]:  # 10,000 runs on this sweep's tasks, 11,000 jobs in the queue
                out.update(runs_status(tmp, [f"{done.array_job_ids[0]}_{i}" for i in range(RUNS)]))
        out.update(sweep_tasks=n, sbatch_calls=sbatches, own_submit_s=round(own, 3), own_submit_s_per_1k=per_1k)
        out.update(status(submitted[-1].sweep_dir))
        out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        print(json.dumps(out))
    finally:
        ids = [j for s in submitted for j in s.array_job_ids]
        subprocess.run(["scancel", *ids, blocker], check=False)
        # Default limits again, and no trace of 111k job records (slurmctld keeps ended ones MinJobAge
        # seconds, and with MaxJobCount back at 10,000 they would block new jobs): a purged start.
        dc.up(2, log=lambda m: None, purge=True)


if __name__ == "__main__":
    main()
