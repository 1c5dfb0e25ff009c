"""Search sweeps without a cluster: the spec's refusals, the study in the sweep folder, the driver's
batches on the local profile, a driver killed mid-study and resumed. On the dev cluster:
tests/cluster/test_cluster_search.py."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from slurmkit.api.handles import SearchHandle
from slurmkit.cli.app import app
from slurmkit.common.locked import try_lock
from slurmkit.common.record import RunFile
from slurmkit.common.sweep_layout import ArrayEntry, ArrayLog, DriverFile, Manifest, SweepPaths
from slurmkit.errors import ConfigError, SlurmkitError
from slurmkit.sweeps import local, search, search_view, spec, study
from tests.conftest import wait_until

runner = CliRunner()
PARAMS = {"kwargs.x": {"uniform": [-2.0, 2.0]}}


def objective(x: float) -> float:
    return (x - 0.3) ** 2


def slow_objective(x: float) -> dict[str, float]:
    import time

    time.sleep(1.5)  # a batch stays in flight long enough to kill its driver meanwhile
    return {"loss": (x - 0.3) ** 2}


def fails_until_flagged(x: float) -> float:
    if x < 0 and not os.path.exists(os.environ["SEARCH_FLAG"]):
        raise ValueError("a negative x fails until the flag is there")
    return (x - 0.3) ** 2


def searched(**fields: Any) -> dict[str, Any]:
    return {"sampler": "tpe", "trials": 6, "batch": 3, "metric": "loss", "seed": 0, "params": PARAMS, **fields}


@pytest.mark.parametrize("sweep, where", [
    ({"search": searched(), "grid": {"env.A": ["1"]}}, "sweep"),
    ({"prune": {"pruner": "median"}, "grid": {"env.A": ["1"]}}, "sweep"),
    ({"search": searched(params={"resources.nodes": {"int": [1, 2]}})}, "sweep.search"),
    ({"search": searched(sampler="grid")}, "sweep.search"),
    ({"search": searched(sampler="gp")}, "sweep.search.sampler"),
    ({"search": searched(params={"config.lrr": {"uniform": [0.1, 1]}})}, "sweep.search.params.config.lrr"),
    ({"search": searched(batch=0)}, "sweep.search.batch"),
    ({"search": searched(sampler="grid", params={"env.A": {"choice": ["1", "2"]}}, trials=3)}, "sweep.search"),
    ({"search": searched(), "prune": {"pruner": "threshold"}}, "sweep.prune"),
])
def test_bad_search_specs_are_refused_where_they_are_wrong(sweep: dict[str, Any], where: str) -> None:
    with pytest.raises(ConfigError) as caught:
        spec.load({"name": "s", "task": "train", "sweep": sweep})
    assert caught.value.where == f"<spec>:{where}"


def test_a_search_spec_dry_run_counts_its_arrays_and_creates_nothing(tmp_path: Path, local_profile: Path) -> None:
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "task": "train", "config": {"steps": 5}, "sweep": {
        "search": {"trials": 10, "batch": 4, "metric": "loss", "params": {"config.lr": {"log_uniform": [1e-4, 0.1]}}},
        "prune": {"pruner": "median", "warmup_steps": 2}}}))
    result = runner.invoke(app, ["sweep", str(path), "-p", str(local_profile), "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert (info["tasks"], info["arrays"], info["varying"]) == (10, 3, ["config.lr"])
    assert not list((tmp_path / "runs").iterdir())


def test_a_param_the_spec_refuses_is_one_line_at_submit(tmp_path: Path, local_profile: Path) -> None:
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "task": "train", "sweep": {
        "search": {"trials": 2, "batch": 1, "metric": "loss", "params": {"config.steps": {"int": [-5, 3]}}}}}))
    result = runner.invoke(app, ["sweep", str(path), "-p", str(local_profile)])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert not list((tmp_path / "runs").iterdir())


def ran_once(paths: SweepPaths, index: int) -> bool:
    return len(RunFile(paths.task(index)).read().job_ids) == 1


def test_a_local_search_asks_batch_by_batch_and_keeps_the_study_in_the_sweep(local_profile: Path) -> None:
    import slurmkit

    handle = slurmkit.sweep(objective, profile=str(local_profile), tasks_per_node=1,
                            search={"trials": 6, "batch": 3, "metric": "loss", "seed": 0,
                                    "params": {"x": {"uniform": [-2.0, 2.0]}}})
    assert isinstance(handle, SearchHandle)
    seen: list[search_view.SearchState] = []
    final = search_view.follow(handle.paths, seen.append, timeout_s=300)  # what `sweep --wait` prints
    assert final.driver == "done" and [s.ended for s in seen][-1] == 6
    assert [s.ended for s in seen] == sorted({s.ended for s in seen}), "a line each time more trials ended"
    bests = [s.best.value for s in seen if s.best is not None and s.best.value is not None]
    assert bests == sorted(bests, reverse=True), "the best so far only improves"
    states = handle.wait(timeout=300)
    assert states == {i: study.COMPLETE for i in range(6)}
    paths = handle.paths
    assert paths.study.is_file() and oct(paths.study.stat().st_mode & 0o777) == "0o600"
    # One local runner (a local "array") per batch: ceil(6 / 3).
    assert len([a for a in ArrayLog(paths).read().arrays if a.kind == "local"]) == math.ceil(6 / 3)
    trials = handle.trials()
    assert [t.number for t in trials] == list(range(6))
    assert all(t.value == pytest.approx(objective(t.params["kwargs.x"])) for t in trials)
    assert len({t.params["kwargs.x"] for t in trials}) == 6, "each batch draws new params"
    best = handle.best()
    assert best is not None and best.value == min(t.value for t in trials if t.value is not None)
    rows = handle.results()
    assert [r["index"] for r in rows][0] == best.number, "a search's results are sorted by its metric"
    assert all(ran_once(paths, i) for i in range(6))
    status = runner.invoke(app, ["sweep", "status", paths.sweep_id, "-p", str(local_profile), "--json"])
    assert json.loads(status.stdout)["search"]["best"]["number"] == best.number

    # A driver recorded as running on another login node: only that node can check it, so a resume
    # here is refused unless forced (that node is gone); forced, it finds nothing left to do.
    DriverFile(paths).update(state="running", host="another-login-node", pid=1, start=1)
    with pytest.raises(SlurmkitError) as refused:
        search_view.resume(paths)
    assert refused.value.where == paths.sweep_id
    assert search_view.resume(paths, force=True) is not None
    wait_until(lambda: DriverFile(paths).read().state == "done", 120, "the forced driver done")
    assert len(Manifest(paths).read().tasks) == 6 and len(handle.trials()) == 6


def test_a_killed_driver_resumes_with_no_trial_lost_or_run_twice(local_profile: Path) -> None:
    import slurmkit

    trials = 7
    handle = slurmkit.sweep(slow_objective, profile=str(local_profile), tasks_per_node=1,
                            search={"trials": trials, "batch": 2, "metric": "loss", "seed": 0,
                                    "params": {"x": {"uniform": [-2.0, 2.0]}}})
    paths = handle.paths
    # Killed once the second batch's runner is started; the gaps a kill can leave are made below.
    wait_until(lambda: len((m := Manifest(paths).read()).tasks) >= 4 and not search.never_submitted(m)
               and all(a.runner_pid for a in m.arrays), 120, "the driver started its second batch")
    driver = DriverFile(paths).read()
    assert driver.pid is not None
    os.kill(driver.pid, signal.SIGKILL)  # the login node going down, as far as the driver can tell
    wait_until(lambda: search_view.search_state(paths).driver == "dead", 30, "the driver seen dead")
    wait_until(lambda: _ended(paths, [2, 3]), 300, "the second batch ended without its driver")
    assert [t.state for t in handle.trials()][2:] == [study.RUNNING] * 2, "nobody told the study"
    assert len(Manifest(paths).read().tasks) == 4, "no driver, no new batch"
    # Drivers that died: after adding trial 4, before its runner's entry; after trial 5's entry,
    # before its runner started; after asking the study for trial 6, before adding it.
    manifest = Manifest(paths).read()
    assert manifest.search is not None
    opened = study.open_study(paths, manifest.search, None)
    for _ in range(2):
        opened.ask(study.distributions(manifest.search))
    search.adopt_asked(paths, manifest, opened)
    with ArrayLog(paths).editing() as log:
        log.arrays.append(ArrayEntry(kind="local", indices=[5]))
        unstarted = len(log.arrays) - 1
    opened.ask(study.distributions(manifest.search))
    assert search.never_submitted(Manifest(paths).read()) == [4]
    with _held(paths.runner_lock(unstarted)):  # a runner started, not yet recorded, holds its lock
        assert local.recover(paths) == []

    resumed = runner.invoke(app, ["sweep", "resume", paths.sweep_id, "-p", str(local_profile)])
    assert resumed.exit_code == 0, resumed.output
    assert handle.wait(timeout=300) == {i: study.COMPLETE for i in range(trials)}
    manifest = Manifest(paths).read()
    assert len(manifest.tasks) == trials
    assert manifest.arrays[unstarted].runner_pid is not None, "the runner never started was started"
    held = [i for arr in manifest.arrays for i in arr.indices]
    assert sorted(held) == list(range(trials)), "each trial in exactly one array"
    assert all(ran_once(paths, i) for i in range(trials))
    assert DriverFile(paths).read().state == "done"


@contextlib.contextmanager
def _held(lock: Path) -> Iterator[None]:
    fd = try_lock(lock)
    try:
        yield
    finally:
        os.close(fd)


def _ended(paths: SweepPaths, indices: list[int]) -> bool:
    from slurmkit.sweeps.results import task_states

    return all(s.state == "COMPLETED" for s in task_states(paths) if s.index in indices)


def test_the_driver_never_imports_torch(local_profile: Path) -> None:
    """The driver runs on the login node, whose CLI never imports torch: Optuna's samplers named
    in config.search do not either (GPSampler, which does, is not one of them)."""
    code = ("import sys, optuna\n"
            "from slurmkit.config.search import SAMPLERS, SearchSection\n"
            "from slurmkit.sweeps import study\n"
            "for name in SAMPLERS:\n"
            "    s = SearchSection(sampler=name, trials=3, metric='loss', params={'env.A': {'choice': [1, 2, 3]}})\n"
            "    st = optuna.create_study(sampler=study.sampler(s))\n"
            "    for _ in range(3):\n"
            "        t = st.ask(study.distributions(s)); study.tell(st, t.number, float(t.params['env.A']))\n"
            "print('torch' in sys.modules)\n")
    import subprocess

    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_resubmit_failed_puts_a_searchs_failed_trials_back_as_new_trials(tmp_path: Path, local_profile: Path) -> None:
    import slurmkit

    flag = tmp_path / "flag"
    handle = slurmkit.sweep(fails_until_flagged, profile=str(local_profile), tasks_per_node=1,
                            env={"SEARCH_FLAG": str(flag)},
                            search={"sampler": "random", "trials": 4, "batch": 4, "metric": "loss", "seed": 3,
                                    "params": {"x": {"uniform": [-1.0, 1.0]}}})
    handle.wait(timeout=300)
    first = handle.trials()
    failed = [t for t in first if t.params["kwargs.x"] < 0]
    assert failed and [t.number for t in first if t.state == study.FAIL] == [t.number for t in failed]
    flag.touch()
    result = runner.invoke(app, ["sweep", "resubmit", handle.sweep_id, "--failed", "-p", str(local_profile), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["resubmitted"] == [t.number for t in failed]
    handle.wait(timeout=300)
    again = handle.trials()[4:]
    assert [t.number for t in again] == list(range(4, 4 + len(failed)))
    assert [t.params for t in again] == [t.params for t in failed]
    assert [t.state for t in again] == [study.COMPLETE] * len(failed)
    assert [t.state for t in handle.trials()[:4]] == [t.state for t in first], "what was told stays told"
    assert all(ran_once(handle.paths, i) for i in range(4 + len(failed)))
