"""Checkpoint figures, each as a ratio to a baseline measured in the same run.

1. commit throughput of a 256 MB state (serialise, checksum, write, fsync, rename, marker) vs
   `dd conv=fsync` of the same size on the same disk (goal >= 0.8);
2. training stall of async saves vs sync saves, same run config (goal <= 4%);
3. crash consistency: SIGKILLs at random moments during saves, then how many checkpoints
   latest_valid() would accept that are corrupt or half-visible (goal 0);
4. hang detection latency of the watchdog at its default floor (goal <= 15 s).

Usage: python benchmarks/bench_checkpoint.py [--dir DIR] [--kills 200]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZE = 256 * 1024**2


def commit_vs_dd(folder: Path, reps: int = 3) -> dict[str, float]:
    """Alternate dd and our commit `reps` times on the same disk; compare medians."""
    import statistics

    import torch

    from slurmkit.worker.checkpoint.store import CheckpointStore, to_bytes

    data = to_bytes({"w": torch.randn(SIZE // 4)})
    t0 = time.perf_counter()
    to_bytes({"w": torch.randn(SIZE // 4)})
    serialise_s = time.perf_counter() - t0
    dd_times, commit_times = [], []
    for rep in range(reps):
        dd_target = folder / "dd.bin"
        t0 = time.perf_counter()
        subprocess.run(["dd", "if=/dev/zero", f"of={dd_target}", "bs=1M", f"count={SIZE // 1024**2}",
                        "conv=fsync"], check=True, capture_output=True)
        dd_times.append(time.perf_counter() - t0)
        dd_target.unlink()
        store = CheckpointStore(str(folder / "ck"))
        t0 = time.perf_counter()
        store.commit(rep, [store.write(rep, "model.pt", data)])
        commit_times.append(time.perf_counter() - t0)
        shutil.rmtree(folder / "ck")
    mb = len(data) / 1024**2
    dd_s, commit_s = statistics.median(dd_times), statistics.median(commit_times)
    return {"state_MB": round(mb, 1), "dd_fsync_MBps": round(mb / dd_s, 1), "commit_MBps": round(mb / commit_s, 1),
            "commit_vs_dd": round(dd_s / commit_s, 3), "serialise_s": round(serialise_s, 3),
            "save_incl_serialise_vs_dd": round(dd_s / (commit_s + serialise_s), 3)}


def stall_async_vs_sync(folder: Path) -> dict[str, float]:
    for key in ("SLURM_PROCID", "SLURM_NTASKS", "SUBMITIT_LOCAL_GLOBALID", "RANK", "WORLD_SIZE"):
        os.environ.pop(key, None)
    from slurmkit.worker.train.tasks.train_task import run

    cfg = {"model": "gpt", "steps": 40, "batch_size": 4, "n_layer": 4, "d_model": 512, "n_head": 8,
           "seq_len": 64, "vocab_size": 256, "dataset_size": 256, "checkpoint_every": 10, "log_every": 100}
    out = {}
    for mode in (False, True):
        summary = run({**cfg, "async_save": mode}, str(folder / f"async-{mode}"))
        out["async" if mode else "sync"] = summary["checkpoint_stall_s"]
    return {"sync_stall_s": out["sync"], "async_stall_s": out["async"],
            "async_stall_vs_sync": out["async"] / out["sync"] if out["sync"] else 0.0}


KILLED_WRITER = """
import sys
from slurmkit.worker.checkpoint.store import CheckpointStore
store = CheckpointStore(sys.argv[1])
step = int(sys.argv[2])
payload = bytes([step % 251]) * (8 * 1024 * 1024)
while True:
    entries = [store.write(step, f"part{i}.bin", payload) for i in range(3)]
    store.commit(step, entries)
    store.prune(3)
    step += 1000
"""


def crash_consistency(folder: Path, kills: int) -> dict[str, float]:
    """After every kill: is the newest committed checkpoint whole (the one latest_valid() picks)?"""
    from slurmkit.worker.checkpoint.store import CheckpointStore

    root = folder / "crash"
    rng = random.Random(0)
    store = CheckpointStore(str(root))
    half_visible = loads = 0
    for k in range(kills):
        proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(root), str(k + 1)])
        time.sleep(rng.uniform(0.15, 0.6))
        proc.kill()
        proc.wait()
        committed = store.committed()
        if committed:
            loads += 1
            # A marker whose files do not verify would be a half-visible checkpoint.
            half_visible += int(store.verify(committed[0]) is None)
    return {"kills": kills, "checks": loads, "half_visible_or_corrupt": half_visible, "goal": 0}


HUNG = """
import sys, time
from slurmkit.worker.ft.watchdog import Watchdog
wd = Watchdog(None, poll_s=0.5).start()
for _ in range(20):
    time.sleep(0.05)
    wd.progress(1.0)  # ~1 s steps: the default timeout is max(10 s, 10 x 1 s)
print(time.time(), flush=True)
time.sleep(120)
"""


def hang_latency() -> dict[str, float]:
    proc = subprocess.Popen([sys.executable, "-c", HUNG], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    hung_at = float(proc.stdout.readline())
    proc.wait(timeout=120)
    return {"hang_detect_s": time.time() - hung_at, "exit_code": proc.returncode, "goal_s": 15}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default=None, help="folder on the disk to measure (default: a temp folder)")
    parser.add_argument("--kills", type=int, default=200)
    args = parser.parse_args()
    folder = Path(args.dir or tempfile.mkdtemp(prefix="bench-ckpt-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(json.dumps({"commit_vs_dd": commit_vs_dd(folder)}), flush=True)
    print(json.dumps({"stall": stall_async_vs_sync(folder)}), flush=True)
    print(json.dumps({"hang": hang_latency()}), flush=True)
    print(json.dumps({"crash_consistency": crash_consistency(folder, args.kills)}), flush=True)


if __name__ == "__main__":
    main()
