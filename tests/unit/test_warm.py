"""Warm restart pieces without Slurm: aborting a gloo group reaches a blocked peer, the group is
rebuilt on the same store, and the host copy brings back the committed state (the whole restart
runs in test_cluster_faults)."""

from __future__ import annotations

import datetime as dt
import multiprocessing
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import TensorDataset

from slurmkit.worker.process_group import Dist, DistEnv, Group
from slurmkit.worker.train import warm
from slurmkit.worker.train.trainer import Trainer, TrainerOptions, params_sha256
from slurmkit.worker.train.trainer_ft import TrainerFT

TIMEOUT_S = 120  # far beyond the test: an error that comes from the timeout says "Timed out"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _gloo_threads() -> int:
    """This process's gloo worker threads (a group's, while it is not freed)."""
    tasks = Path("/proc/self/task")
    return sum((task / "comm").read_text().startswith("pt_gloo") for task in tasks.iterdir())


def _rank(rank: int, port: int, out: Any) -> None:
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    denv = DistEnv(rank, 2, rank, 2, "127.0.0.1", port, "1", "local")
    group = Group(denv, "gloo", torch.device("cpu"), dt.timedelta(seconds=TIMEOUT_S))
    net = torch.nn.Linear(8, 8)
    model = DistributedDataParallel(net)  # its reducer holds the group: destroying it alone closes nothing
    model(torch.ones(2, 8)).sum().backward()
    if rank == 1:
        group.store.set("raised", "1")
        group.abort()
        error = "raised"
    else:
        group.store.wait(["raised"])
        try:
            model(torch.ones(2, 8)).sum().backward()  # rank 1 never joins this all-reduce
            error = "none"
        except RuntimeError as exc:
            error = warm.report_of(rank, exc).error
        group.abort()
    threads = _gloo_threads()
    del model  # its reducer held the aborted group: freeing the group from there, with the GIL held, could deadlock
    kept = _gloo_threads() == threads > 0  # its threads not joined: the group was not freed there
    group.rebuild()  # generation 1, on the same store
    total = torch.ones(1)
    torch.distributed.all_reduce(total)
    group.abort()
    out.put((rank, error, group.generation, float(total), kept))


def test_an_aborted_group_fails_a_blocked_peer_at_once_and_is_rebuilt_on_the_same_store() -> None:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        results = sorted(out.get(timeout=TIMEOUT_S) for _ in procs)
    finally:  # a rank stuck (CI saw one never rebuild) must not hold pytest's exit, which waits for it
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
    (_, blocked, gen0, total0, kept0), (_, raised, gen1, total1, kept1) = results
    assert raised == "raised" and "Connection closed by peer" in blocked and "Timed out" not in blocked
    assert warm.report_of(0, RuntimeError(blocked)).peer_failed  # read as a consequence, not a cause
    assert (gen0, gen1, total0, total1) == (1, 1, 2.0, 2.0)
    assert kept0 and kept1  # slurmkit.worker.at_exit.keep_default_group: a reducer never frees a group


def _trainer(dist: Dist) -> Trainer:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    net = torch.nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(net.parameters(), lr=0.1)
    options = TrainerOptions(steps=100, micro_batch=8, log_every=1000)
    return Trainer(net, optimizer, data, lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]), dist, options)


def _steps(trainer: Trainer, n: int) -> None:
    batches = trainer._batches()
    for _ in range(n):
        trainer.train_step(batches)


@pytest.mark.usefixtures("single_process")
def test_the_host_copy_is_the_committed_state_not_the_save_in_flight_nor_what_training_did_after(
        tmp_path: Path) -> None:
    dist = Dist(DistEnv(0, 1, 0, 1, "127.0.0.1", 0, "0", "single"), "gloo", "cpu")
    trainer = _trainer(dist)
    res = TrainerFT(dist, str(tmp_path / "ckpt"), every=0, host_copy=True)
    try:
        assert res.restore(trainer) is None
        assert res.ckpt.committed is not None and (res.ckpt.committed.step, res.ckpt.committed.on_disk) == (0, False)
        _steps(trainer, 3)
        res.save(trainer, wait=True)
        digest, exp_avg = params_sha256(trainer.raw_model), _exp_avg(trainer)
        _steps(trainer, 2)
        res.save(trainer, wait=False)  # step 5, in flight: the other set of buffers
        _steps(trainer, 1)
        for _ in range(2):  # a second restart finds the host copy as the first left it
            copy = res.restore_from_host(trainer)
            assert (copy.step, trainer.state.step, res.ckpt.resumed_step) == (3, 3, 3)
            assert params_sha256(trainer.raw_model) == digest and torch.equal(_exp_avg(trainer), exp_avg)
            _steps(trainer, 2)  # optimizer steps on what was restored must not reach the host copy
        assert not res.ckpt.writer.pending  # the save in flight was dropped, uncommitted
        assert res.ckpt.store.committed() == [3]
    finally:
        res.finish()


def _exp_avg(trainer: Trainer) -> torch.Tensor:
    state = trainer.optimizer.state_dict()["state"]
    return state[0]["exp_avg"].clone()


def _net_with_buffers_and_rng() -> torch.nn.Module:
    """Batch norm (its statistics change in the forward) and dropout (it draws from the RNG)."""
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Dropout(0.2),
                               torch.nn.Linear(8, 1))


def _live_trainer(dist: Dist, fail: dict[int, str]) -> Trainer:
    """A trainer whose forward of step k raises where fail[k] is "forward"; "update" raises inside
    the optimizer step instead (the parameters are half changed then)."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    net = _net_with_buffers_and_rng()
    optimizer = torch.optim.AdamW(net.parameters(), lr=0.1)
    trainer: Trainer

    def loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
        out = torch.nn.functional.mse_loss(model(batch[0]), batch[1])
        if fail.get(trainer.state.step + 1) == "forward":
            del fail[trainer.state.step + 1]
            raise RuntimeError("transient, after the forward")
        return out

    trainer = Trainer(net, optimizer, data, loss, dist, TrainerOptions(steps=12, micro_batch=8, log_every=1000))
    step = optimizer.step

    def failing_step(*args: Any, **kwargs: Any) -> Any:
        if fail.get(trainer.state.step + 1) == "update":
            del fail[trainer.state.step + 1]
            raise RuntimeError("transient, inside the update")
        return step(*args, **kwargs)

    optimizer.step = failing_step  # type: ignore[method-assign]
    return trainer


@pytest.mark.usefixtures("single_process")
def test_a_failure_before_the_update_restarts_from_the_live_state_bitwise(tmp_path: Path) -> None:
    dist = Dist(DistEnv(0, 1, 0, 1, "127.0.0.1", 0, "0", "single"), "gloo", "cpu")
    reference = _live_trainer(dist, {})
    reference.fit()
    trainer = _live_trainer(dist, {5: "forward", 9: "forward"})
    res = _resilience(dist, tmp_path, trainer)
    restarts = []
    while True:
        try:
            trainer.fit()
            break
        except RuntimeError:
            live = res.live_step(trainer)
            restarts.append(live)
            assert live is not None and res.restore_live(trainer) == live
    res.finish()
    assert restarts == [4, 8] and trainer.state.step == 12
    # The forward had moved the batch-norm statistics and the RNG on: both were put back.
    assert params_sha256(trainer.raw_model) == params_sha256(reference.raw_model)


def _resilience(dist: Dist, tmp_path: Path, trainer: Trainer) -> TrainerFT:
    res = TrainerFT(dist, str(tmp_path / "ckpt"), every=0, host_copy=True)
    res.restore(trainer)
    res.attach(trainer)
    return res


@pytest.mark.usefixtures("single_process")
@pytest.mark.parametrize("where", ["update", "hook"])
def test_a_failure_inside_or_after_the_update_has_no_live_state_to_restart_from(tmp_path: Path, where: str) -> None:
    dist = Dist(DistEnv(0, 1, 0, 1, "127.0.0.1", 0, "0", "single"), "gloo", "cpu")
    trainer = _live_trainer(dist, {3: "update"} if where == "update" else {})
    res = _resilience(dist, tmp_path, trainer)

    def hook(t: Trainer, record: dict[str, Any]) -> None:
        if t.state.step == 3:
            raise RuntimeError("a hook after the update")

    if where == "hook":
        trainer.hooks.append(hook)
    with pytest.raises(RuntimeError):
        trainer.fit()
    res.finish()
    assert res.boundary is not None and res.boundary.step == 2
    assert res.live_step(trainer) is None  # the host copy's path (restore_from_host) is left


def test_the_ranks_restart_from_the_live_state_only_when_every_report_names_the_same_step() -> None:
    def reports(*steps: int | None) -> list[warm.Report]:
        return [warm.Report(r, "RuntimeError: x", r > 0, s) for r, s in enumerate(steps)]

    assert warm.live_step(reports(74, 74)) == 74
    assert warm.live_step(reports(74, None)) is None  # a rank failed past its update (a hook)
    assert warm.live_step(reports(74, 75)) is None
