"""A search that cannot wedge: every value of every distribution checked at submit (each choice,
both ends, the type), a trial whose params still fail at run time told to the study as FAIL while
the search goes on, bounded trials and batches, a stale journal lock taken over and a live one
waited for (reading takes none), grid sweeps refused by `sweep resume`, secret_env checked again
where trials run again, NaN metrics that never rank as best and are null in JSON."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from slurmkit.cli.app import app
from slurmkit.common.locked import try_lock
from slurmkit.common.sweep_layout import DriverFile, Manifest, SweepPaths
from slurmkit.config.search import MAX_TRIALS
from slurmkit.errors import ConfigError
from slurmkit.runs import folders
from slurmkit.sweeps import results, search, search_view, study
from tests.conftest import steady, wait_until

runner = CliRunner()


def search_spec(tmp_path: Path, params: dict[str, Any], name: str = "s", **fields: Any) -> Path:
    """A search over a train task's config (its keys are validated), or over a function's keyword
    arguments (`kwargs.`, which the spec takes as they are: only the distribution's check stands)."""
    path = tmp_path / f"{name}.yaml"
    task = ({"callable": "tests.helpers_fns:always_fails"} if any(k.startswith("kwargs.") for k in params)
            else {"task": "train", "config": {"steps": 2}})
    path.write_text(yaml.safe_dump({"name": name, **task, "sweep": {"search": {
        "trials": 2, "batch": 1, "metric": "loss", "params": params, **fields}}}))
    return path


def refused_with_nothing_left(result: Any, run_root: Path) -> None:
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert "Traceback" not in result.output
    assert not list(run_root.iterdir()), "no sweep folder left"


@pytest.mark.parametrize("params", [
    {"config.steps": {"choice": [2, 0]}},  # valid at its first choice only
    {"config.lr": {"choice": [0.1, -0.1]}},
    {"config.batch_size": {"choice": [64, "a"]}},
    {"config.hidden": {"choice": [4, 8, 0]}},
    {"config.steps": {"int": [1, 3]}, "config.lr": {"choice": [0.1, 0.0]}},  # the second param's
])
def test_every_value_a_trial_could_get_is_checked_at_submit(tmp_path: Path, run_root: Path, local_profile: Path,
                                                            params: dict[str, Any]) -> None:
    path = search_spec(tmp_path, params)
    for extra in (["--dry-run"], []):
        refused_with_nothing_left(runner.invoke(app, ["sweep", str(path), "-p", str(local_profile), *extra]), run_root)


@pytest.mark.parametrize("params, fields", [
    ({"kwargs.x": {"uniform": [float("nan"), 1.0]}}, {}),
    ({"kwargs.x": {"uniform": [float("-inf"), float("inf")]}}, {}),
    ({"kwargs.x": {"uniform": ["a", 1]}}, {}),
    ({"kwargs.x": {"log_uniform": [True, 2]}}, {}),
    ({"kwargs.x": {"int": [1.5, 3]}}, {}),
    ({"kwargs.x": {"choice": [0.1, float("nan")]}}, {}),
    ({"kwargs.x": {"choice": [2, 2]}}, {}),
    ({"kwargs.x": {"choice": [[1], 2]}}, {}),
    ({"kwargs.x": {"int": [1, 3]}}, {"seed": -1}),
    ({"kwargs.x": {"int": [1, 3]}}, {"seed": 2**32}),
    ({"kwargs.x": {"int": [1, 3]}}, {"trials": 1.0e6}),
    ({"kwargs.x": {"int": [1, 3]}}, {"trials": MAX_TRIALS + 1}),
    ({"kwargs.x": {"int": [1, 3]}}, {"batch": 2.0}),
])
def test_bad_distribution_values_are_one_line_with_no_sweep_folder(
        tmp_path: Path, run_root: Path, local_profile: Path, params: dict[str, Any], fields: dict[str, Any]) -> None:
    path = search_spec(tmp_path, params, **fields)
    refused_with_nothing_left(runner.invoke(app, ["sweep", str(path), "-p", str(local_profile)]), run_root)


def test_a_sweep_folder_that_cannot_be_read_is_skipped_by_sweep_list(run_root: Path, local_profile: Path,
                                                                      tmp_path: Path) -> None:
    for name in ("good", "bad"):
        path = search_spec(tmp_path, {"kwargs.x": {"uniform": [0.0, 1.0]}}, name=name, trials=1)
        assert runner.invoke(app, ["sweep", str(path), "-p", str(local_profile)]).exit_code == 0
    bad = next(p for p in folders.list_sweeps(str(run_root)) if p.sweep_id.startswith("bad"))
    wait_until(lambda: DriverFile(bad).read().state != "running", 120, "the driver ended")
    # What an older slurmkit stored of `uniform: [.nan, 1]`: null, which a manifest's reader must not trip on.
    record = json.loads(bad.manifest.read_text())
    record["search"]["params"]["kwargs.x"] = {"uniform": [None, 1]}
    bad.manifest.write_text(json.dumps(record))
    listed = runner.invoke(app, ["sweep", "list", "-p", str(local_profile), "--json"])
    assert listed.exit_code == 0, listed.output
    assert [r["sweep_id"].split("-")[0] for r in json.loads(listed.stdout)] == ["good"]


def test_sweep_resume_refuses_a_grid_sweep_at_the_command(tmp_path: Path, run_root: Path,
                                                          local_profile: Path) -> None:
    spec = tmp_path / "grid.yaml"
    spec.write_text(yaml.safe_dump({"name": "g", "callable": "os:getcwd", "sweep": {"grid": {"env.A": ["1", "2"]}}}))
    assert runner.invoke(app, ["sweep", str(spec), "-p", str(local_profile), "--wait"]).exit_code == 0
    (paths,) = folders.list_sweeps(str(run_root))
    result = runner.invoke(app, ["sweep", "resume", paths.sweep_id, "-p", str(local_profile)])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert not paths.driver.exists(), "no driver started"
    assert runner.invoke(app, ["sweep", "status", paths.sweep_id, "-p", str(local_profile)]).exit_code == 0


def test_secret_env_is_checked_at_resume_and_resubmit(tmp_path: Path, run_root: Path, local_profile: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SK_TEST_SECRET", "s3cret")
    spec = tmp_path / "grid.yaml"
    spec.write_text(yaml.safe_dump({"name": "g", "command": "test -n \"$SK_TEST_SECRET\" && exit 3",
                                    "secret_env": ["SK_TEST_SECRET"], "sweep": {"grid": {"env.A": ["1", "2"]}}}))
    result = runner.invoke(app, ["sweep", str(spec), "-p", str(local_profile), "--wait"])
    assert result.exit_code == 1, result.output  # every task failed (exit 3): --wait says so
    (paths,) = folders.list_sweeps(str(run_root))
    monkeypatch.delenv("SK_TEST_SECRET")
    again = runner.invoke(app, ["sweep", "resubmit", paths.sweep_id, "--failed", "-p", str(local_profile)])
    assert again.exit_code == 2 and len(again.output.strip().splitlines()) == 1, again.output
    assert len(Manifest(paths).read().arrays) == 1, "nothing resubmitted"


def test_a_search_resumed_without_its_secret_is_refused_before_the_driver(
        tmp_path: Path, run_root: Path, local_profile: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SK_TEST_SECRET", "s3cret")
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "s", "callable": "os:getcwd", "secret_env": ["SK_TEST_SECRET"],
                                    "sweep": {"search": {"trials": 1, "batch": 1, "metric": "loss",
                                                         "params": {"env.A": {"choice": ["1"]}}}}}))
    assert runner.invoke(app, ["sweep", str(spec), "-p", str(local_profile)]).exit_code == 0
    (paths,) = folders.list_sweeps(str(run_root))
    wait_until(lambda: DriverFile(paths).read().state != "running", 120, "the driver ended")
    monkeypatch.delenv("SK_TEST_SECRET")
    before = DriverFile(paths).read()
    result = runner.invoke(app, ["sweep", "resume", paths.sweep_id, "-p", str(local_profile)])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert DriverFile(paths).read().pid == before.pid, "no driver started"


def test_a_trial_whose_params_fail_at_run_time_is_failed_and_the_search_goes_on(
        tmp_path: Path, run_root: Path, local_profile: Path) -> None:
    path = search_spec(tmp_path, {"config.steps": {"int": [1, 2]}}, sampler="random", trials=3)
    assert runner.invoke(app, ["sweep", str(path), "-p", str(local_profile)]).exit_code == 0
    (paths,) = folders.list_sweeps(str(run_root))
    search_view.stop_driver(paths)
    manifest = Manifest(paths).read()
    assert manifest.search is not None
    # A value the submit's check could not see: a sampler's (here asked by hand, as a driver killed
    # between its ask and its manifest write leaves it) that the spec refuses.
    opened = study.open_study(paths, manifest.search, None)
    bad = opened.ask({"config.steps": study.optuna_module().distributions.IntDistribution(-3, -1)})
    search.drive(paths, poller=steady(0.5))
    manifest = Manifest(paths).read()
    assert len(manifest.tasks) == 3 and manifest.tasks[bad.number].invalid is not None
    states = {t.number: t.state for t in study.read_trials(paths)}
    assert states[bad.number] == study.FAIL
    assert [s for n, s in sorted(states.items()) if n != bad.number] == [study.COMPLETE] * 2, "the search went on"
    assert results.task_states(paths)[bad.number].state == results.FAILED
    assert DriverFile(paths).read().state == "done"
    assert all(bad.number not in a.indices for a in manifest.arrays), "never submitted"


HOLD_LOCK = """
import sys, time
from slurmkit.common.locked import try_lock
fd = try_lock(__import__("pathlib").Path(sys.argv[1]))
print("held", flush=True)
sys.stdin.read()
"""


def test_a_stale_journal_lock_is_taken_over_and_reading_takes_none(tmp_path: Path, local_profile: Path,
                                                                   run_root: Path) -> None:
    import slurmkit

    handle = slurmkit.sweep(_square, profile=str(local_profile), tasks_per_node=1,
                            search={"trials": 1, "batch": 1, "metric": "loss", "params": {"x": {"choice": [2.0]}}})
    paths: SweepPaths = handle.paths
    wait_until(lambda: DriverFile(paths).read().state != "running", 120, "the driver ended")
    lock = Path(str(paths.study) + ".lock")
    # A holder that died while it held the lock (its name left in the file): the next writer takes it over.
    lock.write_text("pid 999999 on gone-host started 1")
    manifest = Manifest(paths).read()
    assert manifest.search is not None
    opened = study.open_study(paths, manifest.search, None)
    opened.ask(study.distributions(manifest.search))  # a write: it took the lock, then released it
    assert lock.read_text() == "", "released: no holder named"
    # A live holder is waited for by writers; readers (`sweep status`) never take it.
    holder = subprocess.Popen([sys.executable, "-P", "-c", HOLD_LOCK, str(lock)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd="/", env={**os.environ, "PYTHONPATH":
                                                                                 str(Path(__file__).parents[2])})
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(BlockingIOError):
            os.close(try_lock(lock))
        trials = study.read_trials(paths)  # would block for ever if reading took the lock
        assert [t.state for t in trials] == [study.COMPLETE, study.RUNNING]
        status = runner.invoke(app, ["sweep", "status", paths.sweep_id, "-p", str(local_profile), "--json"])
        assert status.exit_code == 0, status.output
    finally:
        holder.communicate("")


def _square(x: float) -> float:
    return x * x


def test_nan_metrics_never_rank_best_and_are_null_in_json(tmp_path: Path, run_root: Path,
                                                          local_profile: Path) -> None:
    spec = tmp_path / "nan.yaml"
    spec.write_text(yaml.safe_dump({"name": "nan", "callable": "tests.helpers_fns:echo_float",
                                    "sweep": {"grid": {"kwargs.value": ["nan", "1.5", "inf", "0.5"]}}}))
    result = runner.invoke(app, ["sweep", str(spec), "-p", str(local_profile), "--wait"])
    assert result.exit_code == 0, result.output
    (paths,) = folders.list_sweeps(str(run_root))
    for largest, best in ((True, 1), (False, 3)):
        table = results.results(paths, "result", largest)
        assert table.best == best
        assert [r["index"] for r in table.rows][:2] == ([1, 3] if largest else [3, 1])
        assert all(math.isnan(r["result"]) or math.isinf(r["result"]) for r in table.rows[2:])
    out = runner.invoke(app, ["sweep", "results", paths.sweep_id, "-p", str(local_profile), "--json",
                              "--sort", "result", "--max"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout, parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))
    assert [r["result"] for r in rows] == [1.5, 0.5, None, None]


def test_sweep_wait_is_non_zero_when_every_trial_failed(tmp_path: Path, run_root: Path, local_profile: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "s", "callable": "tests.helpers_fns:always_fails",
                                    "sweep": {"search": {"trials": 2, "batch": 2, "metric": "loss",
                                                         "params": {"kwargs.x": {"uniform": [0.0, 1.0]}}}}}))
    result = runner.invoke(app, ["sweep", str(spec), "-p", str(local_profile), "--wait"])
    assert result.exit_code == 1, result.output
    (paths,) = folders.list_sweeps(str(run_root))
    assert {t.state for t in study.read_trials(paths)} == {study.FAIL}


def test_a_search_batch_over_its_bound_is_refused() -> None:
    from slurmkit.sweeps import spec

    with pytest.raises(ConfigError) as caught:
        spec.load({"name": "s", "task": "train", "sweep": {"search": {
            "trials": 20_000, "batch": 20_000, "metric": "loss", "params": {"config.steps": {"int": [1, 3]}}}}})
    assert caught.value.where == "<spec>:sweep.search.batch"
