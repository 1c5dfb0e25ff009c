"""Sharded checkpoints (FSDP2 over 2 gloo ranks), each figure against a baseline of the same run.

1. Save throughput: a state of `--mb` MB saved through slurmkit's Checkpointer (DCP shards,
   checksummed in the stream, fsynced, the commit marker last), against two concurrent `dd
   conv=fsync` writers of the same bytes on the same disk: the aggregate commit throughput (bytes /
   seconds from the save's call to its committed marker, the slower rank's) over dd's; goal >= 0.9.
   Each save is followed by its dd pair, so the disk's drift meets both alike. A warm-up save is
   made first and not counted (DCP plans its first save). DCP's own dcp.save of the same state is
   printed beside it.
2. Async save stall: the GPT example under FSDP, a checkpoint every `--every` steps in the
   background, the training thread's time in saves as a share of its step time (goal <= 2%),
   against DCP's own async_save in the same loop (the call, and the wait for the previous save).
3. Crash consistency of sharded saves: `--kills` times, two ranks (forked from this process, torch
   already imported) save an FSDP2 state in a loop and are SIGKILLed together at a random moment;
   then the newest committed step must load whole (every file's checksum, then DCP's load of every
   tensor). Counted: the kills that left a step folder without its commit marker (the kill landed
   inside a save), and the committed steps that would be accepted corrupt (goal 0).

    python benchmarks/bench_sharded.py [--mb 256] [--dir /tmp] [--repeat 3] [--steps 60] [--every 10] [--kills 200]
        [--parts crash,save,stall]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from slurmkit.worker.checkpoint.checkpointer import Checkpointer  # noqa: E402
from slurmkit.worker.process_group import Ranks  # noqa: E402


def _rank(rank: int, world: int, port: int, mb: int, root: str, repeat: int, out: str) -> None:
    """Saves through the Checkpointer, each followed by two concurrent dd of the same bytes (rank 0
    runs them while rank 1 waits), so a drift of the disk's speed meets both alike; then DCP's own
    dcp.save. Rank 0 writes the state's bytes, then a JSON of each series' times."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    width = 2048
    layers = max(1, (mb << 20) // (4 * width * width))
    model = nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(layers)))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    state = {"model": get_state_dict(model, [])[0]}
    ckpt = Checkpointer(root, Ranks(rank, world), keep_latest_k=repeat + 1)  # no pruning timed
    ckpt.save(1, {}, wait=True, sharded=state)  # warm-up: DCP plans its first save
    dist.barrier()
    # dd reads the shards' bytes from memory: copies in /dev/shm, made once, before any clock starts
    staged = [Path(shutil.copy(src, f"/dev/shm/bench-sharded-{os.getpid()}-{i}"))
              for i, src in enumerate(sorted(Path(root, "step-1").glob("*.distcp")))] if rank == 0 else []
    assert len(staged) == (2 if rank == 0 else 0), staged  # one shard a rank
    times: dict[str, list[float]] = {"ours": [], "dd": [], "zeros": [], "dcp": []}
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())  # the whole model
    try:
        for step in range(2, repeat + 2):
            dist.barrier()
            t0 = time.perf_counter()
            ckpt.save(step, {}, wait=True, sharded=state)  # returns once committed on every rank
            times["ours"].append(time.perf_counter() - t0)
            if rank == 0:
                times["dd"].append(dd_pair(Path(root), staged))
                times["zeros"].append(dd_pair(Path(root), [Path("/dev/zero")] * 2, nbytes // 2 >> 20))
    finally:
        for path in staged:
            path.unlink()
    for step in range(repeat):  # DCP's own save of the same state (FileSystemWriter, fsync on)
        dist.barrier()
        t0 = time.perf_counter()
        dcp.save(state, storage_writer=FileSystemWriter(f"{root}-dcp/{step}"))
        dist.barrier()
        times["dcp"].append(time.perf_counter() - t0)
    gathered: list[list[float]] = [[] for _ in range(world)]
    dist.all_gather_object(gathered, times["ours"])
    times["ours"] = [max(t[i] for t in gathered) for i in range(repeat)]  # the slower rank's
    if rank == 0:
        Path(out).write_text(f"{nbytes}\n{json.dumps(times)}")
    dist.destroy_process_group()


GPT = {"model": "gpt", "parallel": "fsdp", "batch_size": 16, "n_layer": 4, "d_model": 256, "n_head": 4,
       "seq_len": 128, "vocab_size": 512, "dataset_size": 2048, "log_every": 1000, "seed": 0}


def stall_rank(rank: int, world: int, port: int, root: str, gpt: dict[str, Any], every: int, out: str) -> None:
    """Both loops on the same ranks: slurmkit's (the Trainer and its Checkpointer), then DCP's async_save.
    Rank 0 writes both stalls as shares of step time and both median steps, then each save's stall in
    seconds (JSON: ours, dcp), then its own summary as JSON."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from slurmkit.worker.checkpoint.checkpointer import Checkpointer
    from slurmkit.worker.train.tasks import train_task

    saves: dict[str, list[float]] = {"ours": [], "dcp": []}
    untimed = Checkpointer.save

    def timed(self: Checkpointer, *args: Any, **kwargs: Any) -> None:  # each save's stall on its own
        t0 = time.perf_counter()
        try:
            untimed(self, *args, **kwargs)
        finally:
            saves["ours"].append(round(time.perf_counter() - t0, 4))

    Checkpointer.save = timed  # type: ignore[method-assign]

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), SLURMKIT_CHECKPOINT_URI=f"{root}/ours")
    ours = train_task.run({**gpt, "checkpoint_every": every, "prefetch_checkpoint": False})
    os.environ.pop("SLURMKIT_CHECKPOINT_URI")
    with train_task.distributed() as dist:
        trainer, _ = train_task.build(train_task.TrainConfig.model_validate(gpt), dist, None)
        # one rank has no process group (none is made for one), and DCP then saves without one
        group = torch.distributed.new_group(backend="gloo") if torch.distributed.is_initialized() else None
        pending: list[Any] = []
        stall = [0.0]

        def save(t: Any, record: dict[str, Any]) -> None:
            if t.state.step % every:
                return
            t0 = time.perf_counter()
            if pending:
                pending.pop().result()
            model_sd, optim_sd = get_state_dict(t.raw_model, t.optimizer)
            pending.append(dcp.async_save({"model": model_sd, "optim": optim_sd}, process_group=group,
                                          storage_writer=FileSystemWriter(f"{root}/dcp/step-{t.state.step}")))
            stall[0] += time.perf_counter() - t0
            saves["dcp"].append(round(time.perf_counter() - t0, 4))

        trainer.hooks.append(save)
        theirs = trainer.fit()
        if pending:
            pending.pop().result()
    if rank == 0:
        def share(stall_s: float, summary: dict[str, Any]) -> float:
            return stall_s / (summary["median_step_s"] * summary["steps"])

        Path(out).write_text(f"{share(ours['checkpoint_stall_s'], ours)} {share(stall[0], theirs)} "
                             f"{ours['median_step_s']} {theirs['median_step_s']}\n{json.dumps(saves)}\n"
                             f"{json.dumps(ours)}")


def _saving_forever(rank: int, root: Path, first_step: int, store_file: Path) -> None:
    """A forked rank: saves a sharded state at every step until it is killed."""
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=2)
    torch.manual_seed(first_step)
    model = nn.Sequential(*(nn.Linear(512, 512) for _ in range(8)))  # 8.4 MB, 16 tensors a side
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    ckpt = Checkpointer(str(root), Ranks(rank, 2), keep_latest_k=2)
    step = first_step
    while True:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)  # every step's values differ: a mix of two steps' shards would not load equal
        ckpt.save(step, {}, wait=True, sharded={"model": model.state_dict()})
        step += 1


def crash_consistency(folder: Path, kills: int) -> dict[str, int]:
    from slurmkit.worker.checkpoint import sharded
    from slurmkit.worker.checkpoint.store import CheckpointError, CheckpointStore

    root, rng = folder / "crash", random.Random(0)
    inside_a_save = checks = corrupt = torn_markers = 0
    for k in range(kills):
        store_file = folder / f"store-{k}"
        pids = []
        for rank in range(2):
            pid = os.fork()
            if pid == 0:
                os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # rank 0's "committed" line at every step
                try:
                    _saving_forever(rank, root, (k + 1) * 1000, store_file)
                finally:
                    os._exit(1)
            pids.append(pid)
        time.sleep(rng.uniform(1.0, 3.0))  # past the start (~1 s), into the saves
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        for pid in pids:
            os.waitpid(pid, 0)
        store_file.unlink(missing_ok=True)
        store = CheckpointStore(str(root))  # nothing remembered from the last check
        steps, committed = store.steps(), store.committed()
        inside_a_save += int(bool(steps) and steps[0] not in committed)
        newest = store.latest_valid()  # the step a restart would load
        torn_markers += int(bool(committed) and newest != committed[0])
        if newest is not None:
            checks += 1
            try:  # every file checksummed, then every tensor loaded
                sharded.full_state(store, newest)
            except (CheckpointError, RuntimeError, ValueError, OSError):
                corrupt += 1
    return {"kills": kills, "inside_a_save": inside_a_save, "checks": checks, "accepted_corrupt": corrupt,
            "marker_over_bad_files": torn_markers}


def dd_pair(folder: Path, sources: list[Path], count_mb: int | None = None) -> float:
    """Two concurrent `dd conv=fsync` writers into `folder`, one of each source (its first `count_mb`
    MB, or all of it)."""
    count = [f"count={count_mb}"] if count_mb is not None else []
    t0 = time.perf_counter()
    procs = [subprocess.Popen(["dd", f"if={src}", f"of={folder / f'dd{i}'}", "bs=1M", *count, "conv=fsync"],
                              stderr=subprocess.DEVNULL) for i, src in enumerate(sources)]
    for p in procs:
        p.wait()
    elapsed = time.perf_counter() - t0
    for i in range(len(sources)):
        (folder / f"dd{i}").unlink()
    return elapsed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--parts", default="crash,save,stall", help="which of the figures, comma-separated")
    args = parser.parse_args()
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(dir=args.dir, prefix="bench-sharded-"))
    parts = args.parts.split(",")
    try:
        if "crash" in parts:  # first: its ranks are forked from this process, before it has any other child
            crash = crash_consistency(root, args.kills)
            print(f"crash consistency: {crash['kills']} SIGKILLs of both ranks, {crash['inside_a_save']} inside a "
                  f"save (a step folder left without its marker); the step a restart would load, loaded whole, "
                  f"{crash['checks']} times: {crash['accepted_corrupt']} accepted corrupt (goal 0); a marker over "
                  f"files that do not verify: {crash['marker_over_bad_files']}", flush=True)
        if "save" in parts:
            save_throughput(root, args.mb, args.repeat)
        if "stall" in parts:
            stall_out = root / "stall"
            mp.spawn(stall_rank, args=(2, free_port(), str(root), {**GPT, "steps": args.steps}, args.every,
                                       str(stall_out)), nprocs=2)
            mine, dcps, step_a, step_b = map(float, stall_out.read_text().splitlines()[0].split())
            print(f"async save stall, GPT under FSDP, a save every {args.every} of {args.steps} steps: slurmkit "
                  f"{mine:.1%} of step time (median step {step_a:.3f} s), DCP's async_save {dcps:.1%} "
                  f"({step_b:.3f} s) (goal <= 2%)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(f"{root / 'ck'}-dcp", ignore_errors=True)


def save_throughput(root: Path, mb: int, repeat: int) -> None:
    out = root / "out"
    mp.spawn(_rank, args=(2, free_port(), mb, str(root / "ck"), repeat, str(out)), nprocs=2)
    nbytes_s, times_s = out.read_text().splitlines()
    nbytes, times = int(nbytes_s), json.loads(times_s)

    def rate(series: str) -> float:
        return nbytes / min(times[series]) / 1e6

    def shown(series: str) -> str:
        return ", ".join(f"{t:.2f}" for t in times[series])

    # each save against the dd right after it
    pairs = sorted(d / o for d, o in zip(times["dd"], times["ours"], strict=True))
    print(f"state {nbytes / 1e6:.0f} MB over 2 ranks; sharded save to commit: best of {repeat} "
          f"{rate('ours'):.0f} MB/s ({shown('ours')} s)")
    print(f"two concurrent dd conv=fsync of the same bytes (the two shards, from memory), each right after a "
          f"save: {rate('dd'):.0f} MB/s ({shown('dd')} s); of as many zeros: {rate('zeros'):.0f} MB/s "
          f"({shown('zeros')} s)")
    print(f"DCP's own dcp.save of the same state: {rate('dcp'):.0f} MB/s")
    print(f"ratio (goal >= 0.9): best against best {rate('ours') / rate('dd'):.2f} of dd of the same bytes "
          f"(save by save: median {pairs[len(pairs) // 2]:.2f}, {min(pairs):.2f}-{max(pairs):.2f}), "
          f"{rate('ours') / rate('zeros'):.2f} of dd of zeros; against DCP alone: {rate('ours') / rate('dcp'):.2f}",
          flush=True)


if __name__ == "__main__":
    main()
