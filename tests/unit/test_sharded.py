"""FSDP2 training with sharded (DCP) checkpoints, on real gloo process groups of 1, 2 and 4 ranks here:
an agreed stop resumes bitwise, a resume on another number of ranks reshards, a damaged shard is
found by the rank that checks it and every rank falls back together, and nothing in a checkpoint
is unpickled beyond DCP's metadata classes and tensors."""

from __future__ import annotations

import io
import os
import pickle
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from slurmkit.worker.checkpoint import sharded
from slurmkit.worker.checkpoint.store import SHARDED, CheckpointError, CheckpointStore
from slurmkit.worker.rank import finish
from tests.s3_server import BUCKET, S3

STEPS = 30
GPT: dict[str, Any] = {"model": "gpt", "parallel": "fsdp", "steps": STEPS, "seed": 5, "checkpoint_every": 10,
                       "batch_size": 8, "n_layer": 2, "d_model": 32, "n_head": 2, "seq_len": 16, "vocab_size": 64,
                       "dataset_size": 256, "log_every": 5}
SHRINK_TOLERANCE = 1e-2
"""|resharded - uninterrupted| / |uninterrupted| per tensor: the bound docs/fault-tolerance.md gives an
elastic shrink of a DDP run (the mean gradient summed in another order)."""

pytestmark = pytest.mark.usefixtures("single_process")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawned(rank: int, target: Callable[..., None], *args: Any) -> None:
    """A spawned rank's work, then its exit the way slurmkit's own ranks leave (rank.finish: other
    threads and atexit's handlers, then os._exit). In Python's finalization torch can abort a process
    whose gloo work is done (slurmkit.worker.at_exit says how), which mp.spawn reports as a failed
    rank; what these tests check is the work, and an exception in it still fails the rank."""
    target(rank, *args)
    finish(0)


def _rank(rank: int, world: int, port: int, config: dict[str, Any], run_dir: str, stop_at: int | None) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from tests.unit.test_resume import incarnation

    incarnation(config, Path(run_dir), stop_at)


def train(world: int, run_dir: Path, stop_at: int | None = None, **changes: Any) -> None:
    """One incarnation on `world` gloo ranks (processes of their own), USR2-stopped at `stop_at`."""
    mp.spawn(_spawned, args=(_rank, world, _free_port(), {**GPT, **changes}, str(run_dir), stop_at), nprocs=world)


def final(run_dir: Path) -> dict[str, torch.Tensor]:
    store = CheckpointStore(str(run_dir / "checkpoints"))
    return sharded.full_state(store, STEPS)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted 2-rank run, and one stopped at step 13 (its checkpoints: step-10, step-13)."""
    root = tmp_path_factory.mktemp("fsdp")
    with pytest.MonkeyPatch.context() as mpatch:
        for key in ("SLURM_PROCID", "SLURM_NTASKS", "SLURMKIT_CHECKPOINT_URI"):
            mpatch.delenv(key, raising=False)
        train(2, root / "whole")
        train(2, root / "stopped", stop_at=13)
    return root


def _resumed(runs: Path, name: str) -> Path:
    run = runs / name
    shutil.copytree(runs / "stopped", run)
    return run


def test_a_sharded_step_holds_every_ranks_shard_and_dcp_index_under_the_commit_marker(runs: Path) -> None:
    store = CheckpointStore(str(runs / "stopped" / "checkpoints"))
    assert store.committed() == [13, 10]
    manifest = store.verify(13)
    assert manifest is not None and manifest["format"] == SHARDED and manifest["world_size"] == 2
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "trainer.pt", "rng-rank0.pt", "rng-rank1.pt"} == set(
        manifest["files"])
    for name in manifest["files"]:  # the checksums taken in the write stream are those of the bytes on disk
        assert store.file_matches(13, name, manifest["files"][name]), name


def test_fsdp_stopped_and_resumed_on_two_ranks_is_bitwise_the_uninterrupted_run(runs: Path) -> None:
    run = _resumed(runs, "again2")
    train(2, run)
    whole, resumed = final(runs / "whole"), final(run)
    assert whole.keys() == resumed.keys() and any(k.startswith("optim.state.") for k in whole)
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)


@pytest.mark.parametrize("world", [1, 4])
def test_fsdp_resumed_on_another_number_of_ranks_reshards(runs: Path, world: int) -> None:
    run = _resumed(runs, f"on{world}")
    train(world, run)
    store = CheckpointStore(str(run / "checkpoints"))
    manifest = store.manifest(STEPS)
    assert manifest is not None and manifest["world_size"] == world
    assert len([n for n in manifest["files"] if n.endswith(".distcp")]) == world
    whole, resumed = final(runs / "whole"), final(run)
    for key, want in whole.items():
        if key.startswith("model."):
            assert float((resumed[key] - want).norm() / want.norm().clamp_min(1e-12)) < SHRINK_TOLERANCE, key


def test_a_damaged_shard_is_found_at_load_and_every_rank_falls_back_to_the_older_step(runs: Path) -> None:
    run = _resumed(runs, "damaged")
    shard = run / "checkpoints" / "step-13" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum, taken by the rank whose share it is, sees it
    shard.write_bytes(bytes(data))
    train(2, run)
    store = CheckpointStore(str(run / "checkpoints"))
    # Resumed from step-10 (step-13 skipped by both ranks), and ran on to the uninterrupted run's end;
    # keep_latest_k (3) did not count the damaged step-13, so step-10 is kept.
    assert store.committed() == [30, 20, 13, 10]
    whole, resumed = final(runs / "whole"), final(run)
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)


def test_fsdp_checkpoints_on_s3_stop_and_resume_bitwise(runs: Path, s3_server: S3, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """DCP's shards and index through fsspec to an S3 server (moto's, tests/s3_server.py), the marker last."""
    uri = f"s3://{BUCKET}/fsdp/{tmp_path.name}"
    monkeypatch.setenv("SLURMKIT_CHECKPOINT_URI", uri)
    train(2, tmp_path / "run", stop_at=13)
    train(2, tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing went to the run folder instead
    store = CheckpointStore(uri)
    assert store.committed() == [30, 20, 13]  # keep_latest_k: 3
    names = set((store.manifest(13) or {}).get("files", {}))
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= names
    whole, resumed = final(runs / "whole"), sharded.full_state(store, STEPS)
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("true",))


def test_dcp_metadata_naming_anything_but_dcps_classes_is_refused(runs: Path) -> None:
    evil = pickle.dumps(_Evil())
    with pytest.raises(pickle.UnpicklingError):
        sharded._MetadataUnpickler(io.BytesIO(evil)).load()
    real = (runs / "stopped" / "checkpoints" / "step-13" / ".metadata").read_bytes()
    assert sharded._MetadataUnpickler(io.BytesIO(real)).load().state_dict_metadata


def test_a_metadata_file_that_is_not_the_committed_one_is_refused_before_it_is_read(runs: Path) -> None:
    run = _resumed(runs, "swapped")
    step = run / "checkpoints" / "step-13"
    (step / ".metadata").write_bytes((run / "checkpoints" / "step-10" / ".metadata").read_bytes())
    with pytest.raises(CheckpointError, match="checksum"):
        sharded.ShardReader(str(step), "0" * 32).read_metadata()
    assert CheckpointStore(str(run / "checkpoints")).verify(13) is None  # its size or checksum differs


def test_is_sharded_sees_dtensors_anywhere_in_a_state() -> None:
    assert not sharded.is_sharded({"a": torch.zeros(2), "b": [1, {"c": torch.ones(1)}]})
    assert sharded.share(["e", "a", "c", "b", "d"], 1, 2) == ["b", "d"]


# --- slurmkit.Checkpoint in a loop of the user's own (FSDP2, their own init_process_group) ---------


def _own_fsdp_loop(rank: int, world: int, port: int, uri: str, stop_at: int | None, out: str) -> None:
    """A user's FSDP2 loop with the few lines slurmkit.Checkpoint takes (restore(like=...), step())."""
    import signal

    import torch.distributed as dist
    from torch import nn
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.fsdp import fully_shard

    import slurmkit
    from slurmkit.worker.ft.stop import AgreedStop

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def state(step: int) -> dict[str, Any]:
        msd, osd = get_state_dict(model, opt)
        return {"model": msd, "optim": osd, "step": step}

    ckpt = slurmkit.Checkpoint(uri, every=4)
    restored = ckpt.restore(like=state(0))
    start = 0
    if restored is not None:
        set_state_dict(model, opt, model_state_dict=restored["model"], optim_state_dict=restored["optim"])
        start = restored["step"]
    whole = {k: v.full_tensor() for k, v in model.state_dict().items()}
    if rank == 0:
        torch.save({"start": start, "weights": whole}, f"{out}.start")
    for step in range(start, 12):
        gen = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(16, 8, generator=gen)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if step + 1 == stop_at:
            os.kill(os.getpid(), signal.SIGUSR2)  # as Slurm would, before the limit
        try:
            ckpt.step(step + 1, lambda n=step + 1: state(n))
        except AgreedStop:  # what a slurmkit run's entry turns into the requeue
            return
    ckpt.close()
    whole = {k: v.full_tensor() for k, v in model.state_dict().items()}
    if rank == 0:
        torch.save({"start": start, "weights": whole}, f"{out}.end")
    dist.destroy_process_group()


def _own(world: int, uri: Path, stop_at: int | None, out: Path) -> None:
    mp.spawn(_spawned, args=(_own_fsdp_loop, world, _free_port(), str(uri), stop_at, str(out)), nprocs=world)


def test_checkpoint_in_a_users_own_fsdp_loop_stops_at_one_step_and_reshards_on_restore(tmp_path: Path) -> None:
    _own(2, tmp_path / "whole", None, tmp_path / "whole")
    _own(2, tmp_path / "ck", 6, tmp_path / "stopped")
    store = CheckpointStore(str(tmp_path / "ck"))
    assert store.committed() == [6, 4]  # every=4, then the agreed stop's step
    manifest = store.manifest(6)
    assert manifest is not None and manifest["format"] == SHARDED
    # On the same two ranks: resumed at step 6, the end is bitwise the uninterrupted run's.
    again = tmp_path / "again"
    shutil.copytree(tmp_path / "ck", again)
    _own(2, again, None, tmp_path / "resumed")
    end, whole_end = torch.load(f"{tmp_path / 'resumed'}.end"), torch.load(f"{tmp_path / 'whole'}.end")
    assert end["start"] == 6 and all(torch.equal(end["weights"][k], whole_end["weights"][k]) for k in end["weights"])
    # On one rank: the 2-rank shards come back whole, equal to what was saved.
    shutil.copytree(tmp_path / "ck", tmp_path / "on1")
    _own(1, tmp_path / "on1", None, tmp_path / "one")
    loaded = torch.load(f"{tmp_path / 'one'}.start")
    saved = sharded.full_state(store, 6)
    assert loaded["start"] == 6
    assert all(torch.equal(loaded["weights"][k], saved[f"state.model.{k}"]) for k in loaded["weights"])


def test_an_fsdp_trainer_over_an_unsharded_model_is_refused_before_its_optimizer_goes_wrong() -> None:
    from torch import nn
    from torch.utils.data import TensorDataset

    from slurmkit.worker.process_group import distributed
    from slurmkit.worker.train.trainer import Trainer, TrainerOptions

    model = nn.Linear(2, 1)
    data = TensorDataset(torch.zeros(4, 2), torch.zeros(4, 1))
    with distributed() as dist, pytest.raises(ValueError):
        Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), data, lambda m, b: m(b[0]).sum(), dist,
                TrainerOptions(steps=1, micro_batch=2, parallel="fsdp"))


# --- the host memory of a save, reserved ahead of the first one ------------------------------------


def test_reserved_host_memory_is_what_the_first_save_copies_into_dtensors_too(tmp_path: Path) -> None:
    """reserve() (run in a thread after the first step) allocates and touches every buffer a save of
    the same state copies into: a DTensor's as a DTensor around a host shard, a plain tensor's as a
    tensor; the copy that follows goes into that memory and equals the live state."""
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from slurmkit.worker.checkpoint.threads import cpu_copy, reserve

    def memory(t: Any) -> int:
        return int((t.to_local() if isinstance(t, DTensor) else t).data_ptr())

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model: Any = fully_shard(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)))
        state: dict[str, Any] = {"sharded": get_state_dict(model, [])[0], "plain": [torch.randn(4, 4), 7]}
        buffers: dict[str, Any] = {}
        reserve(state, buffers)
        assert set(buffers) == {"/sharded/0.weight", "/sharded/0.bias", "/sharded/1.weight", "/sharded/1.bias",
                                "/plain/0"}
        reserved = {key: memory(t) for key, t in buffers.items()}
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        live: dict[str, Any] = get_state_dict(model, [])[0]
        copy: dict[str, Any] = cpu_copy({"sharded": live, "plain": state["plain"]}, buffers)
        for name, value in live.items():
            staged = copy["sharded"][name]
            assert isinstance(staged, DTensor) and staged.placements == value.placements
            assert memory(staged) == reserved[f"/sharded/{name}"] != memory(value)
            assert torch.equal(staged.to_local(), value.to_local())
        assert memory(copy["plain"][0]) == reserved["/plain/0"] and torch.equal(copy["plain"][0], state["plain"][0])
        assert copy["plain"][1] == 7
    finally:
        dist.destroy_process_group()


def test_a_sharded_save_leaves_its_shard_out_of_the_page_cache(tmp_path: Path) -> None:
    """Once DCP has fsynced a shard, its pages are dropped (sharded.ShardWriter): the next save writes
    into freed pages, and the cache keeps what training reads. `fincore` (util-linux) counts the
    shard's resident bytes; a file written the same way without the drop is the control."""
    import subprocess

    import torch.distributed as dist
    from torch import nn
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard

    from slurmkit.worker.checkpoint.checkpointer import Checkpointer
    from slurmkit.worker.process_group import Ranks

    def resident(path: Path) -> int:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
                             capture_output=True, text=True, check=True, timeout=30).stdout
        return int(out.strip())

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model: Any = fully_shard(nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 512)))
        ckpt = Checkpointer(str(tmp_path / "ck"), Ranks(0, 1))
        ckpt.save(1, {}, wait=True, sharded={"model": get_state_dict(model, [])[0]})
    finally:
        dist.destroy_process_group()
    (shard,) = (tmp_path / "ck" / "step-1").glob("*.distcp")
    dropped = resident(shard)
    control = tmp_path / "control"
    control.write_bytes(os.urandom(shard.stat().st_size))
    fd = os.open(control, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    assert resident(control) > 0  # this filesystem keeps what was written in the cache
    assert shard.stat().st_size > 2_000_000 and dropped == 0


def test_a_waited_save_of_a_cpu_state_is_written_from_it_and_an_async_one_from_its_host_copy(tmp_path: Path) -> None:
    """A waited save (the stop's) of a state on the CPU writes the live tensors: nothing goes on before
    its commit, and a host copy would only cost time in the grace window. A save in the background
    writes its host copy: the parameters changed right after it returns are not what it commits."""
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard

    from slurmkit.worker.checkpoint.checkpointer import Checkpointer
    from slurmkit.worker.checkpoint.store import CheckpointStore
    from slurmkit.worker.process_group import Ranks

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model: Any = fully_shard(nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 8)))
        ckpt = Checkpointer(str(tmp_path / "ck"), Ranks(0, 1), keep_latest_k=2)
        live: dict[str, Any] = get_state_dict(model, [])[0]
        before = {k: v.full_tensor().clone() for k, v in live.items()}
        view = torch.arange(1000.0)[10:20]  # a plain tensor beside the shards, a view of a larger storage
        ckpt.save(1, {}, wait=True, sharded={"model": live, "view": view})
        assert ckpt._shard_buffers == {}  # no host copy was made
        ckpt.save(2, {}, wait=False, sharded={"model": live, "view": view})
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        ckpt.finish()
        assert set(ckpt._shard_buffers) == {f"/model/{name}" for name in before} | {"/view"}
    finally:
        dist.destroy_process_group()
    store = CheckpointStore(str(tmp_path / "ck"))
    sizes = []
    for step in (1, 2):
        saved = sharded.full_state(store, step)
        assert saved.keys() == {f"model.{name}" for name in before} | {"view"}
        assert torch.equal(saved["view"], view)
        for name, value in before.items():
            assert torch.equal(saved[f"model.{name}"], value), (step, name)
        sizes.append(sum(f.stat().st_size for f in (tmp_path / "ck" / f"step-{step}").glob("*.distcp")))
    assert sizes[0] == sizes[1]  # the view's own bytes, not its storage's, in both
