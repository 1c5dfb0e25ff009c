"""Sweeps without a cluster: spec expansion, refusals, array planning, the manifest, local sweeps."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from slurmkit.cli.app import app
from slurmkit.common import sweep_layout
from slurmkit.common.record import Failure, RunFile
from slurmkit.common.sweep_layout import ArrayEntry
from slurmkit.runs import folders
from slurmkit.runs.dependency import after_dependency
from slurmkit.sweeps import plan as plan_mod
from slurmkit.sweeps import resolve as resolve_mod
from slurmkit.sweeps import results, spec
from slurmkit.sweeps import submit as sub
from tests.conftest import EXAMPLES

runner = CliRunner()


def write_sweep(tmp_path: Path, sweep: dict[str, Any], **base: Any) -> Path:
    fields = {"name": "sw", "command": "true", "resources": {"time": "00:05:00"}, **base, "sweep": sweep}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(fields))
    return path


def one_line_error(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


def test_grid_list_and_random_combine_as_a_product_in_a_stable_order() -> None:
    section = spec.SweepSection.model_validate({
        "grid": {"config.lr": [0.1, 0.01], "config.seed": [0, 1, 2]},
        "list": [{"config.hidden": 64}, {"config.hidden": 256}],
    })
    tasks = spec.expand(section)
    assert len(tasks) == 12
    assert tasks[0] == {"config.lr": 0.1, "config.seed": 0, "config.hidden": 64}
    assert tasks[-1] == {"config.lr": 0.01, "config.seed": 2, "config.hidden": 256}
    assert spec.expand(section) == tasks


def test_random_samples_are_seeded_and_within_their_ranges() -> None:
    raw = {"random": {"n": 50, "seed": 3, "params": {
        "config.lr": {"log_uniform": [1e-4, 1e-1]}, "config.hidden": {"int": [16, 32]},
        "config.model": {"choice": ["digits", "gpt"]}, "config.weight_decay": {"uniform": [0.0, 0.5]}}}}
    first = spec.expand(spec.SweepSection.model_validate(raw))
    assert first == spec.expand(spec.SweepSection.model_validate(raw))
    assert len(first) == 50
    assert all(1e-4 <= t["config.lr"] <= 1e-1 and 16 <= t["config.hidden"] <= 32 for t in first)
    assert {t["config.model"] for t in first} == {"digits", "gpt"}
    # log-uniform: about half the samples below the geometric middle of the range.
    below = sum(t["config.lr"] < math.sqrt(1e-4 * 1e-1) for t in first)
    assert 10 < below < 40
    raw["random"]["seed"] = 4
    assert spec.expand(spec.SweepSection.model_validate(raw)) != first


def test_chunks_keep_every_array_task_id_below_the_limit() -> None:
    assert plan_mod.chunks(list(range(10)), 4) == [(0, [0, 1, 2, 3]), (4, [4, 5, 6, 7]), (8, [8, 9])]
    assert plan_mod.chunks([1, 3, 5, 9], 4) == [(0, [1, 3]), (4, [5]), (8, [9])]
    for base, members in plan_mod.chunks(list(range(0, 3000, 7)), 1001):
        assert all(0 <= i - base < 1001 for i in members)
    assert plan_mod.compress([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert plan_mod.compress([4]) == "4"


def test_dry_run_shows_each_task_its_seed_and_the_arrays(tmp_path: Path, local_profile: Path) -> None:
    path = write_sweep(tmp_path, {"grid": {"env.LR": ["a", "b", "c"]}, "list": [{"resources.nodes": 1},
                                                                               {"resources.nodes": 2}],
                                  "seed": 100, "max_parallel": 2})
    result = runner.invoke(app, ["sweep", str(path), "-p", str(local_profile), "--dry-run", "--json",
                                 "--max-array-size", "4"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["tasks"] == 6 and info["varying"] == ["env.LR", "resources.nodes"]
    assert [c["seed"] for c in info["configs"]] == [100, 101, 102, 103, 104, 105]
    # Tasks that ask for different resources cannot share an array; each group is chunked at 4.
    assert info["arrays"] == [{"tasks": "0,2", "array": "0,2%2"}, {"tasks": "4", "array": "0%2"},
                              {"tasks": "1,3", "array": "1,3%2"}, {"tasks": "5", "array": "1%2"}]
    assert not list((tmp_path / "runs").iterdir()), "a dry run creates nothing"


def test_train_tasks_take_their_seed_from_the_config(tmp_path: Path, local_profile: Path) -> None:
    result = runner.invoke(app, ["sweep", str(EXAMPLES / "sweep_digits.yaml"), "-p", str(local_profile),
                                 "--dry-run", "--json", "--grid", "config.lr=0.1,0.2,0.3"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["tasks"] == 6  # --grid replaced config.lr's two values with three
    assert sorted({c["config.lr"] for c in info["configs"]}) == [0.1, 0.2, 0.3]
    assert [c["seed"] for c in info["configs"]] == [0, 1] * 3


@pytest.mark.parametrize("sweep, fragment", [
    ({"grid": {"config.lrr": [1, 2]}},
     "sweep.grid.config.lrr: 'config.lrr' is not a run-spec key (did you mean 'lr'?)"),
    ({"grid": {"resources.gpus": [1]}}, "'resources.gpus' is not a run-spec key"),
    ({"list": [{"nmae": "x"}]}, "sweep.list[0].nmae: 'nmae' is not a run-spec key"),
    ({"grid": {"config.lr": []}}, "grid key config.lr has no values"),
    ({}, "the sweep is empty"),
    ({"random": {"n": 2, "params": {"config.lr": {"gauss": [0, 1]}}}}, "one of uniform, log_uniform, int, choice"),
    ({"grid": {"config.steps": [10, -1]}}, "config.steps"),
])
def test_bad_sweeps_are_refused_in_one_line(tmp_path: Path, local_profile: Path, sweep: dict[str, Any],
                                            fragment: str) -> None:
    path = write_sweep(tmp_path, sweep, command=None, task="train")
    line = one_line_error(["sweep", str(path), "-p", str(local_profile), "--dry-run"])
    assert fragment in line
    assert str(path) in line
    assert not list((tmp_path / "runs").iterdir())


def test_a_spec_without_a_sweep_section_is_refused(tmp_path: Path, local_profile: Path) -> None:
    line = one_line_error(["sweep", str(EXAMPLES / "train_digits.yaml"), "-p", str(local_profile)])
    assert "train_digits.yaml:sweep: no sweep section" in line


def test_malformed_grid_option_is_refused(tmp_path: Path, local_profile: Path) -> None:
    line = one_line_error(["sweep", str(EXAMPLES / "sweep_digits.yaml"), "-p", str(local_profile), "--grid", "x"])
    assert "--grid" in line and "KEY=V1,V2" in line


def _create(tmp_path: Path, local_profile: Path, sweep: dict[str, Any], **base: Any) -> sweep_layout.SweepPaths:
    plan = spec.load(write_sweep(tmp_path, sweep, **base))
    return sub.create(plan, resolve_mod.resolve_tasks(plan, str(local_profile)))


def test_manifest_maps_every_task_to_its_config_folder_and_seed(tmp_path: Path, local_profile: Path) -> None:
    paths = _create(tmp_path, local_profile, {"grid": {"env.X": ["1", "2", "3"]}, "seed": 7})
    manifest = sweep_layout.Manifest(paths).read()
    assert [t.overrides for t in manifest.tasks] == [{"env.X": "1"}, {"env.X": "2"}, {"env.X": "3"}]
    assert [t.seed for t in manifest.tasks] == [7, 8, 9]
    entries = [sweep_layout.task_entry(paths, manifest, i) for i in range(3)]
    assert [e.env["SLURMKIT_SEED"] for e in entries] == ["7", "8", "9"]
    assert [e.spec["env"] for e in entries] == [{"X": "1"}, {"X": "2"}, {"X": "3"}]
    assert len({e.run_dir for e in entries}) == 3
    assert all(Path(e.run_dir).parent == paths.sweep_dir / "tasks" for e in entries)
    assert folders.find_sweep(str(tmp_path / "runs"), paths.sweep_id[:8]) == paths
    # Nothing submitted yet: every task is visibly NOT_SUBMITTED, none silently missing.
    assert sweep_layout.latest_job_ids(manifest) == {0: None, 1: None, 2: None}


def test_task_record_is_made_once_and_a_new_job_id_clears_old_verdicts(tmp_path: Path, local_profile: Path) -> None:
    paths = _create(tmp_path, local_profile, {"grid": {"env.X": ["1", "2"]}})
    task = sweep_layout.materialize_task(paths, 1, "50_1")
    record = RunFile(task).read()
    assert record.job_ids == ["50_1"] and record.sweep is not None and record.sweep.index == 1
    assert task.job_folder.resolve() == paths.job_folder.resolve()
    RunFile(task).update(final="deterministic error at step 3", failures=[Failure(step=3)])
    sweep_layout.materialize_task(paths, 1, "50_1")  # the same job again (a requeue): verdicts stay
    assert RunFile(task).read().final
    sweep_layout.materialize_task(paths, 1, "61_0")  # a resubmit: a fresh start
    record = RunFile(task).read()
    assert record.job_ids == ["50_1", "61_0"] and record.final is None and record.failures == []
    with pytest.raises(IndexError):
        sweep_layout.materialize_task(paths, 5, "50_5")


def test_each_array_task_batch_shell_gets_its_own_folder_and_env_quoted(tmp_path: Path,
                                                                       local_profile: Path) -> None:
    values = ["plain", "it's $HOME; `touch pwned` \"x\""]
    paths = _create(tmp_path, local_profile, {"grid": {"env.X": values}})
    for index, want in enumerate(values):
        helper = subprocess.run([sys.executable, "-m", "slurmkit.worker.sweep_task", "--sweep-dir",
                                 str(paths.sweep_dir), "--index", str(index)], capture_output=True, text=True,
                                check=True, env={**os.environ, "SLURM_JOB_ID": f"70{index}"})
        # What the array script does with the helper's answer.
        shown = subprocess.run(["bash", "-c", 'eval "$1"; printf "%s|%s|%s" "$SLURMKIT_RUN_DIR" "$X" '
                                '"$(bash -c \'echo "$SLURMKIT_SEED"\')"', "_", helper.stdout],
                               capture_output=True, text=True, check=True, cwd=tmp_path).stdout
        assert shown == f"{paths.task(index).run_dir}|{want}|{index}"  # exported: child processes see it
    assert not (tmp_path / "pwned").exists()
    bad = subprocess.run([sys.executable, "-m", "slurmkit.worker.sweep_task", "--sweep-dir", str(paths.sweep_dir),
                          "--index", "9"], capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stdout == "" and "no task 9" in bad.stderr


def test_after_a_sweep_waits_for_each_task_newest_job(tmp_path: Path, local_profile: Path) -> None:
    paths = _create(tmp_path, local_profile, {"grid": {"env.X": ["1", "2", "3"]}})
    root = str(tmp_path / "runs")
    line = one_line_error(["submit", str(EXAMPLES / "hostnames.yaml"), "-p", str(local_profile), "--after",
                           paths.sweep_id])
    assert "--after needs a Slurm run or sweep" in line
    paths.manifest.write_text(paths.manifest.read_text().replace('"executor": "local"', '"executor": "slurm"'))
    with sweep_layout.ArrayLog(paths).editing() as m:
        m.arrays = [ArrayEntry(indices=[0, 1, 2], base=0, job_id="70", kind="initial")]
    assert after_dependency(root, paths.sweep_id) == "afterok:70"
    with sweep_layout.ArrayLog(paths).editing() as m:
        m.arrays.append(ArrayEntry(indices=[1], base=1, job_id="80", kind="resubmit"))
    # Array 70 keeps its failed task forever, so afterok:70 could never be met.
    assert after_dependency(root, paths.sweep_id) == "afterok:70_0:80_0:70_2"
    line = one_line_error(["submit", str(EXAMPLES / "hostnames.yaml"), "-p", str(local_profile), "--after", "nope"])
    assert "--after: no run or sweep 'nope'" in line


def wait_local(paths: sweep_layout.SweepPaths, timeout_s: float = 120) -> list[results.TaskState]:
    deadline = time.monotonic() + timeout_s
    while True:
        states = results.task_states(paths)
        if all(s.state in ("COMPLETED", "FAILED", results.NOT_SUBMITTED) for s in states):
            return states
        assert time.monotonic() < deadline, f"local sweep still running: {states}"
        time.sleep(0.5)


def test_local_sweep_runs_through_the_local_executor_then_resubmits_the_failed(tmp_path: Path,
                                                                             local_profile: Path) -> None:
    # Task MODE=flaky fails until a `fixed` file exists in its run folder.
    command = ('echo "mode=$MODE seed=$SLURMKIT_SEED"; '
               'if [ "$MODE" = flaky ] && [ ! -e "$SLURMKIT_RUN_DIR/fixed" ]; then exit 3; fi')
    path = write_sweep(tmp_path, {"grid": {"env.MODE": ["ok", "flaky", "fine"]}, "max_parallel": 2},
                       command=command)
    result = runner.invoke(app, ["sweep", str(path), "-p", str(local_profile), "--json"])
    assert result.exit_code == 0, result.output
    done = json.loads(result.stdout)
    assert done["tasks"] == 3 and done["array_job_ids"] == []
    paths = sweep_layout.SweepPaths(Path(done["sweep_dir"]))
    states = wait_local(paths)
    assert [s.state for s in states] == ["COMPLETED", "FAILED", "COMPLETED"]
    pids = [s.job_id for s in states]

    (paths.task(1).run_dir / "fixed").write_text("")
    result = runner.invoke(app, ["sweep", "resubmit", paths.sweep_id, "--failed", "-p", str(local_profile), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["resubmitted"] == [1]
    states = wait_local(paths)
    assert [s.state for s in states] == ["COMPLETED"] * 3
    assert states[0].job_id == pids[0] and states[2].job_id == pids[2], "only task 1 ran again"
    assert states[1].job_id != pids[1]

    result = runner.invoke(app, ["sweep", "results", paths.sweep_id, "-p", str(local_profile), "--json"])
    rows = json.loads(result.stdout)
    assert [(r["index"], r["state"], r["env.MODE"], r["returncode"]) for r in rows] == [
        (0, "COMPLETED", "ok", 0), (1, "COMPLETED", "flaky", 0), (2, "COMPLETED", "fine", 0)]
    line = one_line_error(["sweep", "results", paths.sweep_id, "-p", str(local_profile), "--sort", "acuracy"])
    assert "--sort: unknown metric 'acuracy'" in line and "valid: returncode" in line


def test_results_pick_the_best_row_and_write_csv(tmp_path: Path, local_profile: Path) -> None:
    paths = _create(tmp_path, local_profile, {"grid": {"env.X": ["1", "2", "3"]}})
    for i, (loss, acc) in enumerate([(0.5, 0.7), (0.2, 0.9), (0.9, 0.95)]):
        task = sweep_layout.materialize_task(paths, i, "")
        task.metrics.write_text(json.dumps({"step": 10, "loss": loss, "accuracy": acc, "note": "text"}) + "\n")
    table = results.results(paths)
    assert table.sort == "loss" and table.best == 1  # smaller loss is better
    assert results.results(paths, sort="accuracy").best == 2  # larger accuracy is better
    assert results.results(paths, sort="accuracy", maximize=False).best == 0
    assert [r["index"] for r in results.results(paths, sort="loss").rows] == [1, 0, 2]
    csv_path = tmp_path / "r.csv"
    result = runner.invoke(app, ["sweep", "results", paths.sweep_id, "-p", str(local_profile), "--csv",
                                 str(csv_path)])
    assert result.exit_code == 0, result.output
    assert "best: task 1 by loss" in result.output
    lines = csv_path.read_text().splitlines()
    assert lines[0] == "index,state,env.X,step,loss,accuracy" and len(lines) == 4


def test_submit_and_sweep_submit_read_the_profile_once(tmp_path: Path, local_profile: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """One profile load a command (its extends chain read once, --set applied to it), after the
    root group's own read (does the profile name a login host: slurmkit.remote.forward.site_of).
    A sweep's command once read it three times (its task cap, its umask, its tasks), submit's twice."""
    from slurmkit.load import loader

    reads: list[str] = []
    real = loader.profile_layers

    def counted(name: str) -> list[Any]:
        reads.append(name)
        return real(name)

    monkeypatch.setattr(loader, "profile_layers", counted)
    spec_path = tmp_path / "one.yaml"
    spec_path.write_text(yaml.safe_dump({"name": "one", "command": "true"}))
    sweep = write_sweep(tmp_path, {"grid": {"env.MODE": ["a", "b"]}})
    for argv in (["submit", str(spec_path), "--dry-run"], ["sweep", "submit", str(sweep), "--dry-run"],
                 ["sweep", "submit", str(sweep), "--set", "profile.sweep_max_tasks=5"]):
        reads.clear()
        result = runner.invoke(app, [*argv, "-p", str(local_profile)])
        assert result.exit_code == 0, result.output
        assert reads == [str(local_profile)] * 2, argv  # site_of's, then the command's one load
