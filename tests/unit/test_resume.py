"""Resuming from checkpoints is bitwise identical to an uninterrupted run (single process here)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from slurmkit.config.train import TrainConfig
from slurmkit.worker.checkpoint.store import DIGEST, CheckpointStore, Entry, to_bytes
from slurmkit.worker.process_group import distributed
from slurmkit.worker.train.faults import InjectedError
from slurmkit.worker.train.incarnation import Incarnation
from slurmkit.worker.train.tasks.train_task import build
from slurmkit.worker.train.tasks.train_task import run as train
from tests.conftest import executed_steps

BASE = {"model": "digits", "steps": 40, "batch_size": 64, "seed": 5, "checkpoint_every": 10}


pytestmark = pytest.mark.usefixtures("single_process")


def incarnation(config: dict[str, Any], run_dir: Path, stop_at: int | None = None) -> dict[str, Any] | None:
    """One incarnation of a training run, stopped at `stop_at` by a USR2 the way Slurm would: the signal
    comes after step stop_at - 1, and the ranks agree on it at the next step boundary."""
    cfg = TrainConfig.model_validate(config)
    with distributed() as dist:
        trainer, _ = build(cfg, dist, run_dir)
        life = Incarnation(dist, str(run_dir), cfg)
        life.attach(trainer)
        if stop_at is not None:
            trainer.hooks.insert(0, lambda t, r: os.kill(os.getpid(), signal.SIGUSR2)
                                 if t.state.step == stop_at - 1 else None)
        summary = trainer.fit()
        life.finish()
        trainer.metrics.close()
        if life.stopped:
            return None
        return {**summary, **life.summary()}


def replace_file(store: CheckpointStore, step: int, name: str, obj: Any) -> None:
    """Rewrite one file of a committed checkpoint and commit it again: whole, with hashes that match."""
    manifest = store.manifest(step)
    assert manifest is not None
    new = store.write(step, name, to_bytes(obj))
    others = [Entry(n, f[DIGEST], f["bytes"]) for n, f in manifest["files"].items() if n != name]
    store.commit(step, [new, *others])


def test_signal_stops_at_the_step_saves_and_resume_is_bitwise_identical(tmp_path: Path) -> None:
    full = train(BASE, str(tmp_path / "full"))
    run_dir = tmp_path / "interrupted"
    assert incarnation(BASE, run_dir, stop_at=17) is None
    store = CheckpointStore(str(run_dir / "checkpoints"))
    assert store.latest_valid() == 17  # the final save happened at the signalled step
    resumed = incarnation(BASE, run_dir)
    assert resumed is not None and resumed["steps"] == 40
    assert resumed["params_sha256"] == full["params_sha256"]
    # Nothing recomputed: the save was at the stop step.
    assert executed_steps(run_dir / "metrics.jsonl") == list(range(1, 41))


@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "no-prefetch"])
def test_a_crashed_run_started_again_resumes_and_records_where_startup_went(tmp_path: Path, prefetch: bool) -> None:
    config = {**BASE, "prefetch_checkpoint": prefetch, "async_save": False}  # step-20 surely committed by step 25
    full = train(config, str(tmp_path / "full"))
    run_dir = tmp_path / "crashed"
    with pytest.raises(InjectedError):
        train({**config, "faults": {"error_at_step": 25}}, str(run_dir))
    # The failed run's watchdog stood down: this process goes on (it would be killed with exit 75).
    assert not any(t.name == "slurmkit-watchdog" and t.is_alive() for t in threading.enumerate())
    resumed = train(config, str(run_dir))
    assert resumed["resumed_from_step"] == 20 and resumed["params_sha256"] == full["params_sha256"]
    records = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    firsts = [r for r in records if "startup" in r]
    assert [r["step"] for r in firsts] == [1, 21]  # the first step of each start, and only that one
    for rec in firsts:
        phases = [rec["startup"][k] for k in ("imports", "rendezvous", "build", "restore", "first_step")]
        assert phases == sorted(phases) and phases[0] > 0


def test_corrupt_newest_checkpoint_falls_back_and_still_matches(tmp_path: Path) -> None:
    full = train(BASE, str(tmp_path / "full"))
    run_dir = tmp_path / "corrupt"
    assert incarnation(BASE, run_dir, stop_at=25) is None
    store = CheckpointStore(str(run_dir / "checkpoints"))
    assert store.committed()[:2] == [25, 20]
    (run_dir / "checkpoints" / "step-25" / "model.pt").write_bytes(b"corrupted on disk")
    assert store.latest_valid() == 20
    resumed = incarnation(BASE, run_dir)
    assert resumed is not None and resumed["resumed_from_step"] == 20
    assert resumed["params_sha256"] == full["params_sha256"]
    # Steps 21-25 recomputed: less than one checkpoint interval.
    assert len(executed_steps(run_dir / "metrics.jsonl")) - 40 == 5


def test_keep_latest_k_during_training(tmp_path: Path) -> None:
    train({**BASE, "keep_latest_k": 2}, str(tmp_path / "k"))
    assert CheckpointStore(str(tmp_path / "k" / "checkpoints")).steps() == [40, 30]


def test_sync_and_async_saves_give_the_same_checkpoint(tmp_path: Path) -> None:
    a = train({**BASE, "async_save": True}, str(tmp_path / "a"))
    b = train({**BASE, "async_save": False}, str(tmp_path / "b"))
    assert a["params_sha256"] == b["params_sha256"]
    sa, sb = CheckpointStore(str(tmp_path / "a" / "checkpoints")), CheckpointStore(str(tmp_path / "b" / "checkpoints"))
    assert sa.manifest(40)["files"]["model.pt"] == sb.manifest(40)["files"]["model.pt"]  # type: ignore[index]


def test_a_checkpoint_that_verifies_but_does_not_load_falls_back(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    full = train(BASE, str(tmp_path / "full"))
    run_dir = tmp_path / "mismatch"
    assert incarnation(BASE, run_dir, stop_at=25) is None
    store = CheckpointStore(str(run_dir / "checkpoints"))
    # Step 25 is whole (its hashes match) but its model no longer fits: e.g. the code changed a layer.
    replace_file(store, 25, "model.pt", {"not.a.layer": torch.zeros(3)})
    assert store.latest_valid() == 25
    capsys.readouterr()
    resumed = incarnation(BASE, run_dir)
    assert resumed is not None and resumed["resumed_from_step"] == 20
    assert resumed["params_sha256"] == full["params_sha256"]
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "does not load" in ln]
    assert len(lines) == 1 and "step-25" in lines[0] and "falling back to step-20" in lines[0]


def test_prune_during_training_never_removes_the_step_resumed_from(tmp_path: Path) -> None:
    run_dir = tmp_path / "resumed"
    assert incarnation({**BASE, "steps": 20}, run_dir, stop_at=20) is None
    store = CheckpointStore(str(run_dir / "checkpoints"))
    for step in (30, 40):  # newer checkpoints left by a run that was rolled back: committed, then corrupted
        store.commit(step, [store.write(step, "model.pt", b"x")])
        (run_dir / "checkpoints" / f"step-{step}" / "model.pt").write_bytes(b"y")
    assert store.latest_valid() == 20
    resumed = incarnation({**BASE, "keep_latest_k": 1}, run_dir)
    assert resumed is not None and resumed["resumed_from_step"] == 20
    after = CheckpointStore(str(run_dir / "checkpoints"))
    assert after.latest_valid() == 40 and after.steps() == [40, 20]  # 20: the step this incarnation resumed from


KILL_IN_SAVE = """
import sys
from slurmkit.worker.train.tasks.train_task import run
run({"model": "digits", "steps": 40, "batch_size": 64, "seed": 5, "checkpoint_every": 10,
     "faults": {"kill_in_save_at_step": 20}}, sys.argv[1])
"""


def test_injected_kill_during_a_save_leaves_no_marker_and_the_run_resumes_exactly(tmp_path: Path) -> None:
    full = train(BASE, str(tmp_path / "full"))
    run_dir = tmp_path / "killed"
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_PROCID", "SLURM_NTASKS", "RANK", "WORLD_SIZE")}
    proc = subprocess.run([sys.executable, "-c", KILL_IN_SAVE, str(run_dir)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert "injected SIGKILL during the save of step 20, after" in proc.stdout
    step20 = run_dir / "checkpoints" / "step-20"
    assert step20.is_dir() and not (step20 / "COMMITTED.json").exists()  # killed mid-write: no marker
    resumed = train({**BASE, "faults": {"kill_in_save_at_step": 20}}, str(run_dir))  # resumed: no second kill
    assert resumed["resumed_from_step"] == 10 and resumed["params_sha256"] == full["params_sha256"]
