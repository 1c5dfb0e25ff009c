"""Training on this machine: a single process in-process, and 2 ranks through the local executor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmkit.common.layout import RunPaths
from slurmkit.config.train import TrainConfig
from slurmkit.load.loader import resolve
from slurmkit.runs import jobs
from slurmkit.worker.train.tasks.train_task import run as train
from tests.conftest import EXAMPLES, steady

SHORT = {"model": "digits", "steps": 40, "batch_size": 64, "seed": 3}


pytestmark = pytest.mark.usefixtures("single_process")


def test_fixed_seed_gives_the_same_digest_twice() -> None:
    a, b = train(SHORT), train(SHORT)
    assert a["params_sha256"] == b["params_sha256"]
    assert train({**SHORT, "seed": 4})["params_sha256"] != a["params_sha256"]


def test_metrics_file_has_one_line_per_step_when_asked(tmp_path: Path) -> None:
    summary = train({**SHORT, "steps": 12, "log_every": 1, "log_min_interval_s": 0}, str(tmp_path))
    lines = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [ln["step"] for ln in lines] == list(range(1, 13)) and {ln["steps"] for ln in lines} == {1}
    assert {"loss", "step_s", "samples_per_s", "tokens_per_s", "mfu"} <= set(lines[0])
    assert summary["steps"] == 12 and 0 < summary["mfu"] < 1


def test_a_log_every_set_by_hand_is_kept_without_a_floor_of_its_own(tmp_path: Path) -> None:
    """`log_every: 5` on a 40-step run: a record every 5 steps, however fast they are (the one-a-second
    floor is the unset cadence's, or one set by hand)."""
    train({**SHORT, "steps": 40, "log_every": 5}, str(tmp_path))
    lines = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [ln["step"] for ln in lines] == [1, *range(5, 41, 5)]
    assert TrainConfig().metrics_cadence == (10, 1.0)
    assert TrainConfig(log_every=5).metrics_cadence == (5, 0.0)
    assert TrainConfig(log_every=5, log_min_interval_s=2).metrics_cadence == (5, 2.0)


def test_metrics_records_aggregate_intervals_and_always_keep_first_and_last(tmp_path: Path) -> None:
    summary = train({**SHORT, "steps": 14, "log_every": 4, "log_min_interval_s": 0}, str(tmp_path))
    lines = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # The first step of the process has its own record (it carries start-up), so does the last one.
    assert [(ln["step"], ln["steps"]) for ln in lines] == [(1, 1), (4, 3), (8, 4), (12, 4), (14, 2)]
    assert "startup" in lines[0] and all("startup" not in ln for ln in lines[1:])
    for ln in lines:
        assert ln["step_s_min"] <= ln["step_s"] <= ln["step_s_max"] <= ln["step_s_sum"]
        assert ln["samples"] == 64 * ln["steps"] and ln["tokens"] == 0  # digits: not a token model
        assert ln["samples_per_s"] == pytest.approx(ln["samples"] / ln["step_s_sum"])
    assert lines[-1]["loss"] != summary["loss"]  # the record holds the interval's mean, the summary the last step


def test_gpt_task_reports_tokens_per_s_and_mfu() -> None:
    summary = train({"model": "gpt", "steps": 6, "batch_size": 4, "n_layer": 1, "d_model": 32, "n_head": 2,
                     "seq_len": 16, "vocab_size": 64, "dataset_size": 64})
    assert summary["tokens_per_s"] == pytest.approx(summary["samples_per_s"] * 16)
    assert summary["mfu"] > 0 and summary["peak_source"].startswith("CPU estimate")
    assert summary["loss"] < 4.2  # ln(64) = 4.16 is chance


def test_gradient_accumulation_matches_the_same_global_batch() -> None:
    # Same global batch, split into 2 micro-steps: equal up to float summation order.
    plain = train({**SHORT, "steps": 20})
    accum = train({**SHORT, "steps": 20, "grad_accum": 2})
    assert accum["global_batch"] == plain["global_batch"] == 64
    assert accum["loss"] == pytest.approx(plain["loss"], rel=1e-3)


def test_batch_that_does_not_split_is_refused() -> None:
    with pytest.raises(ValueError, match="does not split"):
        train({**SHORT, "batch_size": 63, "grad_accum": 2})


def _local_run(tmp_path: Path, local_profile: Path, sets: list[str]) -> RunPaths:
    sub = jobs.submit(resolve(EXAMPLES / "train_digits.yaml", str(local_profile), sets))
    paths = RunPaths(Path(sub.run_dir))
    assert jobs.wait(paths, poller=steady(0.5), timeout_s=180).state == "COMPLETED"
    return paths


def test_two_local_ranks_end_with_identical_parameters(tmp_path: Path, local_profile: Path) -> None:
    paths = _local_run(tmp_path, local_profile, ["config.steps=60"])
    ranks = [jobs.result(paths, rank=r) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["params_sha256"] == ranks[1]["params_sha256"]
    # Two ranks with the same global batch follow the single-process run up to float rounding.
    single = train({"model": "digits", "steps": 60, "batch_size": 64, "lr": 0.003, "seed": 0})
    assert ranks[0]["loss"] == pytest.approx(single["loss"], rel=1e-3, abs=1e-4)


def test_trainer_from_a_users_own_callable(tmp_path: Path, local_profile: Path) -> None:
    spec = tmp_path / "own.yaml"
    spec.write_text("name: own\ncallable: tests.helpers_fns:custom_trainer\nkwargs: {steps: 80}\n")
    sub = jobs.submit(resolve(spec, str(local_profile)))
    paths = RunPaths(Path(sub.run_dir))
    assert jobs.wait(paths, poller=steady(0.5), timeout_s=120).state == "COMPLETED"
    ranks = [jobs.result(paths, rank=r) for r in (0, 1)]
    assert ranks[0]["world_size"] == 2 and ranks[0]["global_batch"] == 32
    assert ranks[0]["params_sha256"] == ranks[1]["params_sha256"]
    assert ranks[0]["loss"] < 0.05  # a linear target is learnt
