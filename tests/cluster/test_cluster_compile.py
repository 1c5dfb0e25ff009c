"""A compiled Trainer (config.compile) on the dev cluster through every restart path of a DDP run:
warm (in the same processes), in-job (a standby's processes on a new srun step) and a requeue (a new
incarnation). Each new process loads the run's compiled code from its cache and compiles nothing."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from slurmkit.common.metrics import read_records
from slurmkit.common.record import RunFile
from slurmkit.runs import jobs
from tests.cluster.test_cluster_faults import (
    EVERY,
    FINE_LOG,
    STEPS,
    finish,
    incarnations,
    signal_rank_at_step,
    start,
    steps_done,
)
from tests.conftest import wait_until

pytestmark = pytest.mark.cluster


def test_a_compiled_ddp_run_restarts_warm_in_the_job_and_requeued_compiling_only_once(
        cluster: None, dev_profile: Path) -> None:
    paths, job = start(dev_profile, "config.compile=true", "config.faults.transient_error_at_steps=[30]",
                       "profile.requeue.in_job=2", "profile.requeue.standby=true", *FINE_LOG)
    wait_until(lambda: any(r.kind == "warm" for r in RunFile(paths).read().restarts), what="the warm restart")
    signal_rank_at_step(paths, 1, EVERY + EVERY // 2, signal.SIGKILL)  # mid-interval: no save in flight
    wait_until(lambda: any(r.kind == "in_job" and r.resumed_step is not None
                           for r in RunFile(paths).read().restarts), what="the in-job restart")
    now = (steps_done(paths) or [0])[-1]  # the in-job restarts are spent now (the warm one counts)
    signal_rank_at_step(paths, 1, now - now % EVERY + EVERY + EVERY // 2, signal.SIGKILL)
    assert finish(paths) == "COMPLETED"

    restarts = RunFile(paths).read().restarts
    assert [(r.kind, r.cause) for r in restarts] == [("warm", "crash"), ("in_job", "crash"), ("requeue", "crash")]
    assert incarnations(job) == ["REQUEUED", "COMPLETED"]
    results = [jobs.result(paths, rank=r) for r in (0, 1)]
    assert results[0]["params_sha256"] == results[1]["params_sha256"]  # the ranks stayed in step
    assert results[0]["steps"] == STEPS and results[0]["compile_s"] > 0
    # Rank 0's first step in each process: the first compiled; the standby's and the requeued ones loaded it.
    firsts = [r["compile_cache"] for r in read_records(paths.metrics) if "startup" in r]
    assert len(firsts) == 3, firsts
    assert firsts[0]["misses"] > 0
    assert all(c["hits"] > 0 and c["misses"] == 0 for c in firsts[1:]), firsts
