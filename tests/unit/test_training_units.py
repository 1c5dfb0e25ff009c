"""FLOP, MFU and bus-bandwidth formulas against hand-computed figures; rank detection from env."""

from __future__ import annotations

import random
import socket

import pytest

from slurmkit.bench.allreduce import busbw, sizes
from slurmkit.common.ports import TRAINING, free_local_port, training_port
from slurmkit.worker import process_group
from slurmkit.worker.train.flops import (
    PEAK_BF16_FLOPS,
    dense_flops_per_sample,
    gpt_flops_per_token,
    mfu,
    peak_flops,
)


def test_gpt_flops_per_token_by_hand() -> None:
    # N=1e6, L=2, H=4, Q=32, T=64: 6e6 + 12*2*4*32*64 = 6,000,000 + 196,608
    assert gpt_flops_per_token(1_000_000, 2, 4, 32, 64) == 6_196_608


def test_gpt_flops_match_nanogpt_estimate() -> None:
    # nanoGPT's estimate_mfu: flops_per_token = 6*N + 12*L*H*Q*T (GPT-2 124M: N~85M non-embedding)
    n, layers, heads, q, t = 85_000_000, 12, 12, 64, 1024
    assert gpt_flops_per_token(n, layers, heads, q, t) == 6 * n + 12 * layers * heads * q * t


def test_dense_flops_per_sample_by_hand() -> None:
    # 64x128 + 128x128 + 128x10 weights = 8192 + 16384 + 1280 = 25856; x6 = 155136
    assert dense_flops_per_sample([64 * 128, 128 * 128, 128 * 10]) == 155_136


def test_mfu_by_hand() -> None:
    # 1e15 FLOPs in 1 s on 4 ranks of 1e15 peak = 25%
    assert mfu(1e15, 1.0, 4, 1e15) == pytest.approx(0.25)
    assert mfu(1e15, 0.0, 4, 1e15) == 0.0


def test_peak_table_and_cpu_estimate() -> None:
    # The names torch.cuda.get_device_name() gives for each GPU of benchmarks/gpu_check.sh's list.
    names = {"NVIDIA H100 80GB HBM3": 989e12, "NVIDIA H100 PCIe": 756e12, "NVIDIA H100 NVL": 835e12,
             "NVIDIA H200": 989e12, "NVIDIA GH200 480GB": 989e12, "NVIDIA A100-SXM4-80GB": 312e12,
             "NVIDIA A100 80GB PCIe": 312e12, "NVIDIA L40S": 362e12, "NVIDIA B200": 2.25e15}
    assert {name: peak_flops(name, 8)[0] for name in names} == names
    assert all("table" in peak_flops(name, 8)[1] for name in names)
    assert set(PEAK_BF16_FLOPS.values()) == set(names.values())
    value, source = peak_flops(None, 2)
    assert value == 128e9 and "CPU estimate" in source
    assert peak_flops(None, 2, override=1e12) == (1e12, "config.peak_flops")


def test_busbw_matches_nccl_tests_formula() -> None:
    # nccl-tests all_reduce: busBw = algBw * 2*(nranks-1)/nranks
    for n in (2, 4, 8, 16):
        assert busbw(10.0, n) == pytest.approx(10.0 * 2 * (n - 1) / n)
    assert busbw(10.0, 8) == pytest.approx(17.5)
    assert busbw(10.0, 1) == 10.0


def test_sizes_span_8_bytes_to_256_mib() -> None:
    s = sizes()
    assert s[0] == 8 and s[-1] == 256 * 1024**2 and len(s) == 26
    assert all(b == 2 * a for a, b in zip(s, s[1:], strict=False))


def test_master_port_is_derived_from_the_job_id_in_range() -> None:
    assert training_port("12345") == 20000 + 2345
    assert training_port("45000") == 20000
    picked = {training_port(str(j)) for j in range(0, 100000, 7)}
    assert min(picked) >= 20000 and max(picked) <= 24999


def _bindable(port: int) -> bool:
    try:
        for host in ("127.0.0.1", ""):
            with socket.socket() as s:
                s.bind((host, port))
    except OSError:
        return False
    return True


def test_a_local_runs_port_is_never_one_something_on_the_machine_listens_on() -> None:
    base, span = TRAINING
    # The first seed whose start port nothing holds now (a dev-cluster job beside this test may
    # hold one: CI saw "Address already in use" with a fixed seed).
    seed = next(s for s in range(7, 1000) if _bindable(base + random.Random(s).randrange(span)))
    start = base + random.Random(seed).randrange(span)
    for host in ("127.0.0.1", ""):  # a loopback listener, and one on every interface (a dev-cluster node's)
        with socket.socket() as held:
            held.bind((host, start))
            held.listen(1)
            picked = free_local_port(random.Random(seed))
            assert picked != start and base <= picked < base + span
    with socket.socket() as again:  # and the pick itself was free
        again.bind(("127.0.0.1", picked))


def test_master_addr_is_the_first_host_of_the_nodelist_without_scontrol(monkeypatch: pytest.MonkeyPatch) -> None:
    launch_env(monkeypatch, SLURM_PROCID="0", SLURM_NTASKS="2", SLURM_JOB_ID="9", SLURM_JOB_NODELIST="gpu-a[07-08]")
    monkeypatch.setenv("PATH", "/nonexistent")  # as in a container image without Slurm's binaries
    assert process_group.detect().master_addr == "gpu-a07"


LAUNCHER_VARS = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_JOB_ID",
                 "SUBMITIT_EXECUTOR", "SUBMITIT_LOCAL_GLOBALID", "SUBMITIT_LOCAL_LOCALID", "SUBMITIT_LOCAL_NTASKS",
                 "SUBMITIT_LOCAL_JOB_ID", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                 "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def launch_env(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    """Exactly these launcher variables, none inherited from whatever runs the tests."""
    for key in LAUNCHER_VARS:
        monkeypatch.delenv(key, raising=False)
    for key, value in values.items():
        monkeypatch.setenv(key, value)


def test_detect_from_slurm_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    launch_env(monkeypatch, SLURM_PROCID="3", SLURM_NTASKS="4", SLURM_LOCALID="1", SLURM_NTASKS_PER_NODE="2(x2)",
               SLURM_JOB_ID="777", MASTER_ADDR="node1")
    env = process_group.detect()
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 4, 1, 2)
    assert (env.master_addr, env.master_port, env.launcher) == ("node1", 20777, "slurm")


def test_detect_from_submitit_local_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    launch_env(monkeypatch, SUBMITIT_EXECUTOR="local", SUBMITIT_LOCAL_GLOBALID="1", SUBMITIT_LOCAL_LOCALID="1",
               SUBMITIT_LOCAL_NTASKS="2", SUBMITIT_LOCAL_JOB_ID="4242")
    env = process_group.detect()
    assert (env.rank, env.world_size, env.master_addr, env.master_port) == (1, 2, "127.0.0.1", 24242)
    assert env.launcher == "local"


def test_torchrun_ranks_inside_an_srun_step_are_torchrun_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """One torchrun per node under srun: the step says task 1 of 2, torchrun says rank 5 of 8."""
    launch_env(monkeypatch, SLURM_PROCID="1", SLURM_NTASKS="2", SLURM_JOB_ID="31", SLURM_JOB_NODELIST="n[1-2]",
               TORCHELASTIC_RUN_ID="31", RANK="5", WORLD_SIZE="8", LOCAL_RANK="1", LOCAL_WORLD_SIZE="4",
               MASTER_ADDR="n1", MASTER_PORT="29500")
    env = process_group.detect()
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (5, 8, 1, 4)
    assert (env.master_addr, env.master_port, env.launcher, env.job_id) == ("n1", 29500, "torchrun", "31")
    assert process_group.rank_env(env) == {"MASTER_ADDR": "n1", "MASTER_PORT": "29500", "RANK": "5", "WORLD_SIZE": "8",
                                  "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}


@pytest.mark.parametrize(("version", "buffer"), [("2.13.0+cpu", "TORCH_FR_BUFFER_SIZE"),
                                                 ("2.9.0a0+git1234", "TORCH_FR_BUFFER_SIZE"),
                                                 ("2.8.0+cu128", "TORCH_NCCL_TRACE_BUFFER_SIZE")])
def test_the_flight_recorders_buffer_is_set_under_the_name_the_ranks_torch_reads(version: str, buffer: str) -> None:
    added = process_group.nccl_defaults(version, {})
    assert added == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", buffer: "2000"}


def test_a_users_own_nccl_settings_win_under_either_name_of_the_buffer() -> None:
    given = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}
    assert process_group.nccl_defaults("2.13.0", given) == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
    assert process_group.nccl_defaults("2.8.0", {"TORCH_FR_BUFFER_SIZE": "50"}) \
        == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}


def test_a_step_sees_the_same_samples_whatever_the_number_of_ranks_sharing_its_global_batch() -> None:
    """What an elastic shrink relies on: the Trainer's sampler and loader (shuffled, drop_last) give
    step i of an epoch the same block of the permutation for 2 ranks x 4 as for 1 rank x 8."""
    import torch
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    data = TensorDataset(torch.arange(101))

    def steps(world: int) -> list[set[int]]:
        loaders = [DataLoader(data, batch_size=8 // world, drop_last=True, sampler=DistributedSampler(
            data, num_replicas=world, rank=r, shuffle=True, seed=3, drop_last=True)) for r in range(world)]
        for loader in loaders:
            loader.sampler.set_epoch(2)  # type: ignore[attr-defined]
        return [set().union(*(b[0].tolist() for b in batches)) for batches in zip(*loaders, strict=True)]

    two, one = steps(2), steps(1)
    assert len(two) == len(one) == 12 and two == one
