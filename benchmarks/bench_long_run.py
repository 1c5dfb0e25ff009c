"""Long runs: checkpoint state and report cost that do not grow with the step count.

1. trainer.pt at step 1,000 vs step 100,000 of the same run (a one-layer model, one process, a
   checkpoint every 1,000 steps): bytes, and the time to load and apply it (median of 50 loads).
   Baseline in the same run: what trainer.pt held before (every step's record) at step 100,000.
   Goals: sizes equal within 1 KB; restore equal within noise.
2. `report` (PNG) and the goodput accounting of a synthetic 1,000,000-step metrics file, one
   record per step (the worst case: log_every 1, no floor), each in a fresh process: seconds and
   peak RSS. Baseline in the same run: a fresh process reading the file once with a bare
   `json.loads` loop. Goals: <= 3x the baseline, < 200 MB.

Usage: python benchmarks/bench_long_run.py [--steps 100000] [--records 1000000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BARE = "import json, sys\nfor line in open(sys.argv[1], 'rb'):\n    json.loads(line)\n"
REPORT = ("import sys; from pathlib import Path; from slurmkit import report\n"
          "from slurmkit.common.layout import RunPaths\n"
          "report.write(RunPaths(Path(sys.argv[1])), Path(sys.argv[1]) / 'report.png')\n")
HWM = "\nprint(open('/proc/self/status').read().split('VmHWM:')[1].split()[0])\n"
GOODPUT = ("import sys; from pathlib import Path; from slurmkit import goodput\n"
           "print(goodput.of_file(Path(sys.argv[1]) / 'metrics.jsonl', []).result().steps)\n")


def checkpoint_sizes(steps: int, folder: Path) -> dict[str, Any]:
    import torch

    from slurmkit.config.train import TrainConfig
    from slurmkit.worker.checkpoint.store import CheckpointStore, to_bytes
    from slurmkit.worker.process_group import distributed
    from slurmkit.worker.train.incarnation import Incarnation
    from slurmkit.worker.train.trainer import Trainer, TrainerOptions, TrainState

    cfg = TrainConfig.model_validate({"steps": steps, "checkpoint_every": 1000, "keep_latest_k": steps // 1000,
                                      "async_save": False, "log_every": 1000})
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    with distributed() as dist:
        net = torch.nn.Linear(4, 1)
        trainer = Trainer(net, torch.optim.SGD(net.parameters(), lr=0.01), data,
                          lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]), dist,
                          TrainerOptions(steps=steps, micro_batch=8, log_every=1000))
        life = Incarnation(dist, str(folder), cfg)
        life.attach(trainer)
        try:
            trainer.fit()
            life.finish()
        finally:
            life.close()
    store = CheckpointStore(str(folder / "checkpoints"))
    out: dict[str, Any] = {}
    for step in (1000, steps):
        raw = (folder / "checkpoints" / f"step-{step}" / "trainer.pt").read_bytes()
        loads = []
        for _ in range(50):
            t0 = time.perf_counter()
            TrainState().load(store.load(step, "trainer.pt"))
            loads.append(time.perf_counter() - t0)
        out[f"step_{step}"] = {"bytes": len(raw), "restore_ms": round(statistics.median(loads) * 1e3, 3)}
    history = [{"step": s, "loss": 0.5, "step_s": 0.001} for s in range(1, steps + 1)]
    out["before_full_history_bytes"] = len(to_bytes({"step": steps, "epoch": 0, "batch_in_epoch": 0,
                                                     "history": history, "scheduler": None}))
    out["size_difference_bytes"] = out[f"step_{steps}"]["bytes"] - out["step_1000"]["bytes"]
    return out


def synthetic_run(folder: Path, records: int) -> None:
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"run_id": folder.name, "executor": "local", "name": "synthetic"}))
    t, rows = 1_000_000.0, []
    with (folder / "metrics.jsonl").open("w") as fh:
        for s in range(1, records + 1):
            step_s = 0.2 + (s % 7) * 0.001
            t += step_s
            rows.append(json.dumps({"time": round(t, 3), "step": s, "steps": 1, "loss": 2.0 / (1 + s / 1e4),
                                    "step_s": step_s, "step_s_min": step_s, "step_s_max": step_s,
                                    "step_s_sum": step_s, "ckpt_stall_s": 0.0, "samples_per_s": 320.0,
                                    "tokens_per_s": 0.0, "mfu": 0.41, "lr": 3e-4}))
            if len(rows) == 10000:
                fh.write("\n".join(rows) + "\n")
                rows = []
        if rows:
            fh.write("\n".join(rows) + "\n")


def fresh_process(code: str, arg: Path) -> tuple[float, float]:
    """(seconds, peak RSS in MB) of `python -c code arg` in a new process; the peak is the process's
    own VmHWM (rusage's maxrss can carry the forking parent's)."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code + HWM, str(arg)], check=True, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    return seconds, int(out.stdout.split()[-1]) / 1024


def report_cost(records: int, folder: Path) -> dict[str, Any]:
    run = folder / "synthetic-run"
    synthetic_run(run, records)
    bare_s, bare_mb = fresh_process(BARE, run / "metrics.jsonl")
    report_s, report_mb = fresh_process(REPORT, run)
    goodput_s, goodput_mb = fresh_process(GOODPUT, run)
    return {"records": records, "file_MB": round((run / "metrics.jsonl").stat().st_size / 1024**2),
            "bare_json_loop_s": round(bare_s, 2), "bare_peak_MB": round(bare_mb),
            "report_s": round(report_s, 2), "report_peak_MB": round(report_mb),
            "report_vs_bare": round(report_s / bare_s, 2),
            "goodput_s": round(goodput_s, 2), "goodput_peak_MB": round(goodput_mb),
            "goodput_vs_bare": round(goodput_s / bare_s, 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--records", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "ckpt").mkdir()
        print(json.dumps({"checkpoint": checkpoint_sizes(args.steps, Path(tmp) / "ckpt")}), flush=True)
        print(json.dumps({"report": report_cost(args.records, Path(tmp))}), flush=True)


if __name__ == "__main__":
    main()
