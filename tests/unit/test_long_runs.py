"""Long runs: checkpoint state and metrics readers that do not grow with the step count."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from slurmkit.common.metrics import Interval, iter_records, iter_records_reversed, last_record, read_records
from slurmkit.config.train import TrainConfig
from slurmkit.insight import goodput
from slurmkit.slurm.parse import Incarnation
from slurmkit.worker.checkpoint.store import CheckpointStore, from_bytes
from slurmkit.worker.process_group import distributed
from slurmkit.worker.train.tasks.train_task import build
from slurmkit.worker.train.tasks.train_task import run as train
from tests.conftest import executed_steps
from tests.unit.test_resume import BASE

pytestmark = pytest.mark.usefixtures("single_process")


def test_trainer_state_does_not_grow_with_the_step_count(tmp_path: Path) -> None:
    train({**BASE, "steps": 300, "checkpoint_every": 100, "async_save": False}, str(tmp_path))
    store = CheckpointStore(str(tmp_path / "checkpoints"))
    size = {step: store.manifest(step)["files"]["trainer.pt"]["bytes"] for step in (200, 300)}  # type: ignore[index]
    # A history of every step grew ~40 bytes a step (4 KB between these two); the window is full at both.
    assert abs(size[300] - size[200]) <= 16, size
    meta = from_bytes((tmp_path / "checkpoints" / "step-300" / "trainer.pt").read_bytes())
    assert "history" not in meta and len(meta["step_times"]) == 100 and meta["step"] == 300


def test_log_every_100_gives_the_same_steps_losses_and_goodput_as_every_step(tmp_path: Path) -> None:
    config = {**BASE, "steps": 300, "checkpoint_every": 0, "log_min_interval_s": 0}
    train({**config, "log_every": 1}, str(tmp_path / "every"))
    train({**config, "log_every": 100}, str(tmp_path / "hundred"))
    every = read_records(tmp_path / "every" / "metrics.jsonl")
    hundred = read_records(tmp_path / "hundred" / "metrics.jsonl")
    assert len(every) == 300 and [(r["step"], r["steps"]) for r in hundred] == [(1, 1), (100, 99), (200, 100),
                                                                               (300, 100)]
    assert executed_steps(tmp_path / "hundred" / "metrics.jsonl") == list(range(1, 301))
    # Same seed, same steps: each interval's loss is the mean of the per-step losses it covers.
    for rec in hundred:
        losses = [r["loss"] for r in every if rec["step"] - rec["steps"] < r["step"] <= rec["step"]]
        assert rec["loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-9)
    # The accounting of the per-step records, and of the same records folded 100 steps to a record.
    acc_a, acc_b = goodput.of_records(every, []), goodput.of_records(fold(every, 100), [])
    a, b = acc_a.result(), acc_b.result()
    assert b.steps == a.steps == 300
    for key in ("wall_s", "checkpoint_stall_s", "recomputed_s"):
        assert getattr(b, key) == pytest.approx(getattr(a, key), rel=1e-9, abs=1e-12), key
    # Exact but for the first step's warm-up, counted beyond the median step, a median of medians here.
    assert abs(b.productive_s - a.productive_s) <= abs(acc_a.typical - acc_b.typical) + 1e-9
    # The typical step of folded records is the median over steps of their intervals' medians (this
    # machine's noise moves it from the per-step median by over half at times, so that is not compared).
    folded = sorted((r["step_s"], r.get("steps", 1)) for r in fold(every, 100))
    cumulative = [sum(n for _, n in folded[:i + 1]) for i in range(len(folded))]
    median = next(v for (v, _), c in zip(folded, cumulative, strict=True) if c > 300 // 2)
    # Bucketing is monotonic, so the median of the bucketed times is the bucket of the median: exact.
    assert acc_b.typical == goodput.step_bucket(median)


def fold(records: list[dict[str, Any]], every: int) -> list[dict[str, Any]]:
    """Per-step records through the Trainer's Interval: a record per `every` steps, the first alone."""
    interval, out = Interval(every), []
    for i, r in enumerate(records):
        extra = {k: v for k, v in r.items() if k not in ("step", "loss", "step_s", "time", "steps")}
        rec = interval.add(r["step"], r["step_s"], r["loss"], extra, force=i in (0, len(records) - 1))
        if rec is not None:
            out.append({**rec, "time": r["time"]})
    return out


def test_goodput_prorates_an_interval_recomputed_in_part() -> None:
    # Incarnation 1 logs 1, 2-10, 11-20 and crashes; incarnation 2 resumes from step 15: 16, 17-20, 21-30.
    incs = [Incarnation("7", 0.0, 10.0, 40.0, "NODE_FAIL", "node1"),
            Incarnation("7", 45.0, 50.0, 90.0, "COMPLETED", "node2")]
    recs = [{"step": last, "steps": n, "time": t, "step_s": 1.0, "step_s_sum": float(n), "ckpt_stall_s": 0.0}
            for last, n, t in [(1, 1, 11.0), (10, 9, 20.0), (20, 10, 30.0), (16, 1, 51.0), (20, 4, 55.0),
                               (30, 10, 65.0)]]
    gp = goodput.account(recs, incs)
    assert gp.steps == 30 and gp.recomputed_s == 5.0  # steps 16-20 of the (11-20) interval
    assert gp.productive_s == 30.0 and gp.queue_wait_s == 10.0  # ended at 40, running again at 50
    assert goodput.of_records(recs, incs).restart_overheads() == [0.0]  # its first step began at 50, when it ran


def test_reverse_reader_matches_the_forward_one_across_blocks_and_skips_a_cut_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "pad": "x" * (s % 700)}) for s in range(1, 3001)]  # ~1 MB: many 64 KB blocks
    path.write_text("\n".join(lines) + "\n\n" + '{"step": 3001, "lo')  # a blank line, a line cut by a kill
    forward = list(iter_records(path))
    assert [r["step"] for r in forward] == list(range(1, 3001))
    assert list(iter_records_reversed(path)) == forward[::-1]
    assert last_record(path) == forward[-1]
    assert last_record(tmp_path / "missing.jsonl") is None and list(iter_records_reversed(tmp_path / "x")) == []


def test_goodput_of_a_long_file_runs_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with path.open("w") as fh:
        for s in range(1, 100_001):
            fh.write(json.dumps({"time": 1000.0 + s * 0.01, "step": s, "steps": 1, "loss": 1.0, "step_s": 0.01,
                                 "step_s_sum": 0.01, "ckpt_stall_s": 0.0, "mfu": 0.1, "samples_per_s": 10.0}) + "\n")
    tracemalloc.start()
    try:
        acc = goodput.of_file(path, [])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert acc.result().steps == 100_000
    # 100,000 parsed records held at once take ~60 MB; streaming holds a block and a few records.
    assert peak < 2_000_000, peak


def test_a_step_that_fails_mid_interval_still_writes_the_steps_before_it(tmp_path: Path) -> None:
    cfg = TrainConfig.model_validate({**BASE, "log_every": 100, "log_min_interval_s": 0})
    with distributed() as dist:
        trainer, _ = build(cfg, dist, tmp_path)
        inner, calls = trainer.loss_fn, []

        def failing(model: Any, batch: Any) -> Any:
            calls.append(1)
            if len(calls) == 8:
                raise RuntimeError("a failing step")
            return inner(model, batch)

        trainer.loss_fn = failing
        with pytest.raises(RuntimeError, match="a failing step"):
            trainer.fit()
        trainer.metrics.close()
    # Steps 1 (its own record) and 2-7 (the interval cut short by the failure of step 8).
    assert [(r["step"], r["steps"]) for r in read_records(tmp_path / "metrics.jsonl")] == [(1, 1), (7, 6)]
