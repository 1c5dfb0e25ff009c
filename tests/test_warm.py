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

from slurmkit.worker import warm
from slurmkit.worker.dist import Dist, DistEnv, Group
from slurmkit.worker.resilience import Resilience
from slurmkit.worker.trainer import Trainer, TrainerOptions, params_sha256

TIMEOUT_S = 120  # far beyond the test: an error that comes from the timeout says "Timed out"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
    del model
    group.rebuild()  # generation 1, on the same store
    total = torch.ones(1)
    torch.distributed.all_reduce(total)
    group.abort()
    out.put((rank, error, group.generation, float(total)))


def test_an_aborted_group_fails_a_blocked_peer_at_once_and_is_rebuilt_on_the_same_store() -> None:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=TIMEOUT_S) for _ in procs)
    for p in procs:
        p.join(30)
    (_, blocked, gen0, total0), (_, raised, gen1, total1) = results
    assert raised == "raised" and "Connection closed by peer" in blocked and "Timed out" not in blocked
    assert warm.report_of(0, RuntimeError(blocked)).peer_failed  # read as a consequence, not a cause
    assert (gen0, gen1, total0, total1) == (1, 1, 2.0, 2.0)


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
    res = Resilience(dist, str(tmp_path / "ckpt"), every=0)
    res.host_copy = True
    try:
        assert res.restore(trainer) is None
        assert res.committed is not None and (res.committed.step, res.committed.on_disk) == (0, False)
        _steps(trainer, 3)
        res.save(trainer, wait=True)
        digest, exp_avg = params_sha256(trainer.raw_model), _exp_avg(trainer)
        _steps(trainer, 2)
        res.save(trainer, wait=False)  # step 5, in flight: the other set of buffers
        _steps(trainer, 1)
        for _ in range(2):  # a second restart finds the host copy as the first left it
            copy = res.restore_from_host(trainer)
            assert (copy.step, trainer.state.step, res.resumed_step) == (3, 3, 3)
            assert params_sha256(trainer.raw_model) == digest and torch.equal(_exp_avg(trainer), exp_avg)
            _steps(trainer, 2)  # optimizer steps on what was restored must not reach the host copy
        assert not res.writer.pending  # the save in flight was dropped, uncommitted
        assert res.store.committed() == [3]
    finally:
        res.finish()


def _exp_avg(trainer: Trainer) -> torch.Tensor:
    state = trainer.optimizer.state_dict()["state"]
    return state[0]["exp_avg"].clone()
