"""Experiment trackers, for real: MLflow (a sqlite store) read back with MLflow's own client,
TensorBoard event files read back with tensorboard's EventAccumulator, W&B in offline mode with its
run folders checked. One run, two incarnations (a crash at step 25, resumed from step 20): one
tracker run, every step once where the tracker can overwrite, the restart as an event."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from slurmkit.cli.app import app
from slurmkit.common.layout import RunPaths
from slurmkit.common.metrics import read_records
from slurmkit.common.record import RestartEntry, RunFile, RunRecord, SweepRef
from slurmkit.config.tracking import Tracking
from slurmkit.worker import tracking
from slurmkit.worker.train.faults import InjectedError
from slurmkit.worker.train.tasks.train_task import run as train

pytestmark = pytest.mark.usefixtures("single_process")

CONFIG = {"model": "digits", "steps": 30, "batch_size": 64, "seed": 5, "checkpoint_every": 10, "async_save": False,
          "log_every": 1, "log_min_interval_s": 0}


def run_folder(tmp_path: Path, tracking_cfg: dict[str, Any], run_id: str = "digits-20261204-000000-abcd",
               sweep: SweepRef | None = None) -> RunPaths:
    paths = RunPaths(tmp_path / run_id)
    paths.run_dir.mkdir(mode=0o700)
    spec = {"name": "digits", "task": "train", "config": CONFIG, "tracking": tracking_cfg}
    RunFile(paths).create(RunRecord(run_id=run_id, name="digits", run_dir=str(paths.run_dir), sweep=sweep, spec=spec,
                                    resources={"nodes": 1, "tasks_per_node": 1},
                                    snapshot={"commit": "0123abc", "dirty": False}))
    return paths


def crash_then_resume(paths: RunPaths) -> None:
    """Incarnation 1 crashes at step 25 (committed: step-20); incarnation 2 resumes from 20, reruns 21-25."""
    with pytest.raises(InjectedError):
        train({**CONFIG, "faults": {"error_at_step": 25}}, str(paths.run_dir))
    tracking.activate(None)  # a new process would start with none
    with RunFile(paths).editing() as record:
        record.restarts.append(RestartEntry(kind="requeue", n=1, job_id="7", cause="crash", time="now",
                                            resumed_step=20, lost_steps=5))
    train(CONFIG, str(paths.run_dir))
    tracking.activate(None)


def test_one_mlflow_run_across_incarnations_with_params_every_step_and_the_restart(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    paths = run_folder(tmp_path, {"mlflow": uri, "project": "digits-exp"})
    crash_then_resume(paths)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("digits-exp")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])  # one tracker run for both incarnations
    assert run.data.tags[tracking.tracker_backends.RUN_TAG] == paths.run_id and run.info.status == "FINISHED"
    assert run.data.params["config.steps"] == "30" and run.data.params["git.commit"] == "0123abc"
    steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "loss"))
    # MLflow keeps both values of the steps run again (21-25), marked by the restart at step 20
    assert steps == sorted([*range(1, 31), *range(21, 26)])
    (restart,) = client.get_metric_history(run.info.run_id, "slurmkit/restart")
    assert restart.step == 20
    assert [m.value for m in client.get_metric_history(run.info.run_id, "slurmkit/lost_steps")] == [5.0]
    assert any(k.startswith("slurmkit/restart/20/") for k in run.data.tags)


def test_tensorboard_event_files_hold_every_step_once_after_a_resume(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    paths = run_folder(tmp_path, {"tensorboard": True})
    crash_then_resume(paths)
    assert len(list(paths.tensorboard.iterdir())) == 2  # an event file per incarnation
    events = EventAccumulator(str(paths.tensorboard))
    events.Reload()
    loss = events.Scalars("loss")
    assert [e.step for e in loss] == list(range(1, 31))  # the first incarnation's 21-25 purged
    final = {r["step"]: r["loss"] for r in read_records(paths.metrics)}  # the last value of each step
    assert [e.value for e in loss] == pytest.approx([final[s] for s in range(1, 31)], rel=1e-6)
    assert [e.step for e in events.Scalars("slurmkit/restart")] == [20]


def test_wandb_offline_resumes_the_same_run_id_in_the_run_folder(tmp_path: Path) -> None:
    paths = run_folder(tmp_path, {"wandb": "offline", "project": "digits-exp"})
    crash_then_resume(paths)
    folders = sorted((paths.run_dir / "wandb").glob(f"offline-run-*-{paths.run_id}"))
    assert len(folders) == 2  # one per incarnation, one W&B run id: `wandb sync` joins them
    assert all((f / f"run-{paths.run_id}.wandb").stat().st_size > 0 for f in folders)
    # `slurmkit track RUN` hands both to `wandb sync` on the login node (--dry-run: no network here)
    result = CliRunner().invoke(app, ["track", str(paths.run_dir), "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["folders"] == [str(f) for f in folders]


def test_track_says_in_one_line_when_a_run_names_no_tracker(tmp_path: Path) -> None:
    paths = run_folder(tmp_path, {})
    result = CliRunner().invoke(app, ["track", str(paths.run_dir)])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1


def test_track_sends_an_ended_runs_goodput_accounting_to_its_tracker_run(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    paths = run_folder(tmp_path, {"mlflow": uri})
    crash_then_resume(paths)
    # What `status` caches in run.json once sacct has the ended job (a local run has no sacct)
    RunFile(paths).update(goodput={"goodput": 0.82, "queue_wait_s": 12.0, "node_hours": 0.5, "job_id": "7"})
    result = CliRunner().invoke(app, ["track", str(paths.run_dir), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["accounting"] == {"goodput": 0.82, "queue_wait_s": 12.0, "node_hours": 0.5}
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("digits").experiment_id])  # type: ignore[union-attr]
    assert run.data.metrics["final.goodput"] == 0.82 and run.data.metrics["final.goodput_queue_wait_s"] == 12.0
    assert [m.step for m in client.get_metric_history(run.info.run_id, "final.goodput")] == [30]


def test_a_sweep_task_is_a_child_of_one_parent_run(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for index in (0, 1):
        paths = run_folder(tmp_path, {"mlflow": uri}, f"digits-20261204-00000{index}-ab{index}d",
                           SweepRef(sweep_id="sweep-digits-1", index=index, overrides={"config.lr": index}))
        train({**CONFIG, "steps": 3}, str(paths.run_dir))
        tracking.activate(None)
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("digits").experiment_id])  # type: ignore[union-attr]
    parents = [r for r in runs if r.data.tags.get("slurmkit/parent") == "1"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert len(parents) == 1 and len(children) == 2
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert {c.data.params["sweep.index"] for c in children} == {"0", "1"}


def test_a_users_own_log_reaches_the_runs_tracker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import slurmkit

    paths = run_folder(tmp_path, {"tensorboard": True})
    monkeypatch.setenv("SLURMKIT_RUN_DIR", str(paths.run_dir))
    monkeypatch.setenv("RANK", "0")
    tracking.activate(None)
    monkeypatch.setattr(tracking, "_opened", False)
    for step in (1, 2, 3):
        slurmkit.tracking.log({"my_metric": step * 10.0}, step)
    assert tracking._active is not None
    tracking._active.close()
    events = EventAccumulator(str(paths.tensorboard))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("my_metric")] == [(1, 10.0), (2, 20.0), (3, 30.0)]
    tracking.activate(None)


def test_a_tracking_uri_that_is_none_is_refused_in_one_line() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as refused:
        Tracking(mlflow="mlruns")
    assert refused.value.errors()[0]["loc"] == ("mlflow",)  # where, for the one line (file:tracking.mlflow)
    assert Tracking(mlflow="sqlite:////tmp/x.db").any and not Tracking().any


def test_a_tracker_the_ranks_python_lacks_is_refused_at_submit(tmp_path: Path) -> None:
    from slurmkit.errors import PreflightError
    from slurmkit.load.loader import resolve
    from slurmkit.slurm import imports

    profile = tmp_path / "p.yaml"
    profile.write_text("extends: local\npython: /usr/bin/python3\n")  # Debian's own: no torch, no tracker
    spec = {"name": "t", "command": "true", "tracking": {"wandb": "offline", "tensorboard": True}}
    with pytest.raises(PreflightError) as refused:
        imports.check_packages(resolve(spec, str(profile)))
    assert str(refused.value.where).endswith(":tracking") and "wandb" in str(refused.value)
    imports.check_packages(resolve(spec, "local"))  # this interpreter has them
    train = {"name": "t", "task": "train", "config": {"model": "digits"}}
    with pytest.raises(PreflightError) as no_torch:  # the client installs without torch: the ranks need it
        imports.check_packages(resolve(train, str(profile)))
    assert str(no_torch.value.where).endswith(":task")
    imports.check_packages(resolve(train, "local"))


def test_the_docs_example_through_submit_on_the_local_profile(tmp_path: Path) -> None:
    """The spec in docs/tracking.md, as written but for its store's path and the run root: submitted with
    the CLI, run by the local executor's two ranks, its tracking reaching rank 0 through run.json."""
    import yaml
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from slurmkit.runs.lookup import find_run

    text = (Path(__file__).resolve().parents[2] / "docs" / "tracking.md").read_text()
    spec = yaml.safe_load(text.split("# train-tracked.yaml\n", 1)[1].split("```", 1)[0])
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec["tracking"]["mlflow"] = uri
    (tmp_path / "train-tracked.yaml").write_text(yaml.safe_dump(spec))
    profile = tmp_path / "p.yaml"
    profile.write_text(f"extends: local\nrun_root: {tmp_path / 'runs'}\n")
    result = CliRunner().invoke(app, ["submit", str(tmp_path / "train-tracked.yaml"), "-p", str(profile), "--wait",
                                      "--json"])
    assert result.exit_code == 0, result.output
    paths = find_run(str(tmp_path / "runs"), json.loads(result.stdout)["run_id"])
    steps = [r["step"] for r in read_records(paths.metrics)]
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("digits").experiment_id])  # type: ignore[union-attr]
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "loss")) == steps
    assert run.data.params["resources.tasks_per_node"] == "2" and run.info.status == "FINISHED"
    events = EventAccumulator(str(paths.tensorboard))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == steps
    assert list((paths.run_dir / "wandb").glob(f"offline-run-*-{paths.run_id}"))


USER_SCRIPT = """
import mlflow, wandb

# A user's own loop with the trackers' own API and no run ids of its own: slurmkit's variables say which
run = wandb.init()
with mlflow.start_run() as mine:
    for step in range(1, 4):
        mlflow.log_metric("user_acc", step / 10, step=step)
        run.log({"user_acc": step / 10}, step=step)
run.finish()
print("logged", run.id, mine.info.run_id)
"""


def test_a_users_command_with_the_trackers_own_api_logs_to_the_runs_tracker_runs(tmp_path: Path) -> None:
    import yaml
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (tmp_path / "user_train.py").write_text(USER_SCRIPT)
    spec = {"name": "mine", "command": f"python {tmp_path / 'user_train.py'}", "resources": {"tasks_per_node": 1},
            "tracking": {"mlflow": uri, "wandb": "offline"}}
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(spec))
    profile = tmp_path / "p.yaml"
    profile.write_text(f"extends: local\nrun_root: {tmp_path / 'runs'}\n")
    result = CliRunner().invoke(app, ["submit", str(tmp_path / "mine.yaml"), "-p", str(profile), "--wait", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    _, wandb_id, mlflow_id = out["result"]["stdout"].split()
    assert wandb_id == out["run_id"]  # W&B's run is the slurmkit run's
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("mine").experiment_id])  # type: ignore[union-attr]
    assert run.info.run_id == mlflow_id and run.data.tags[tracking.tracker_backends.RUN_TAG] == out["run_id"]
    assert [m.step for m in client.get_metric_history(mlflow_id, "user_acc")] == [1, 2, 3]


def test_an_mlflow_server_that_never_answers_is_dropped_within_the_bound(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound is what lets it go (shortened here below MLflow's own 5 s request timeout)."""
    import socket

    monkeypatch.setattr(tracking, "OPEN_TIMEOUT_S", 2.0)
    with socket.socket() as server:  # accepts connections (the kernel's backlog) and never answers
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        paths = run_folder(tmp_path, {"mlflow": f"http://127.0.0.1:{server.getsockname()[1]}"})
        opened = tracking.Trackers.open(paths.run_dir)
    assert opened is not None
    assert opened.dropped == {"mlflow": "TimeoutError"} and opened.backends == []
    assert capsys.readouterr().err.count("mlflow left out") == 1
    opened.log({"loss": 1.0}, 1)  # training goes on without it


def test_a_tracker_call_that_does_not_return_is_dropped_and_the_others_go_on(monkeypatch: pytest.MonkeyPatch,
                                                                             tmp_path: Path) -> None:
    import threading

    monkeypatch.setattr(tracking, "CALL_TIMEOUT_S", 0.5)
    never = threading.Event()
    logged: list[int] = []

    class Stuck:
        name = "stuck"

        def metrics(self, step: int, values: dict[str, float]) -> None:
            never.wait()

    class Fine:
        name = "fine"

        def metrics(self, step: int, values: dict[str, float]) -> None:
            logged.append(step)

    info = tracking.RunInfo("r", "r", "r", Tracking(), RunPaths(tmp_path), {})
    both = tracking.Trackers(info, [Stuck(), Fine()])  # type: ignore[list-item]
    both.log({"loss": 1.0}, 1)
    both.log({"loss": 0.5}, 2)
    never.set()
    assert both.dropped == {"stuck": "TimeoutError"} and logged == [1, 2]


def test_a_password_in_a_tracking_uri_is_refused_and_never_echoed() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as refused:
        Tracking(mlflow="https://bob:s3cret-pw@mlflow.example.org")
    assert "s3cret-pw" not in str(refused.value.errors()[0]["msg"])
    assert Tracking(mlflow="https://mlflow.example.org").mlflow  # credentials come from secret_env instead
    assert tracking.redact("ConnectionError: https://bob:pw@h/api") == "ConnectionError: https://***@h/api"


def test_a_ranks_python_older_than_slurmkit_supports_is_refused_at_submit(tmp_path: Path) -> None:
    from slurmkit.errors import PreflightError
    from slurmkit.load.loader import resolve
    from slurmkit.slurm import imports

    old = Path.home() / ".pyenv" / "versions" / "3.10.13" / "bin" / "python"
    if not old.exists():
        pytest.skip("no Python 3.10 here (pyenv's)")
    profile = tmp_path / "p.yaml"
    profile.write_text(f"extends: local\npython: {old}\n")
    with pytest.raises(PreflightError) as refused:
        imports.check_packages(resolve({"name": "t", "command": "true"}, str(profile)))
    assert refused.value.where == "profile:python"


def test_a_tracker_that_never_answers_is_tried_once_and_said_once(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    """A command's rank opens MLflow for the command's environment, then for its own logging and at
    the run's end: a server that accepts and never answers is waited for once, in one line."""
    import threading

    monkeypatch.setattr(tracking, "OPEN_TIMEOUT_S", 0.5)
    answer = threading.Event()
    tried: list[str] = []

    class Silent:
        def __init__(self, info: Any, uri: str) -> None:
            tried.append(uri)
            answer.wait()

    monkeypatch.setattr(tracking.tracker_backends, "Mlflow", Silent)
    paths = run_folder(tmp_path, {"mlflow": "http://127.0.0.1:9"})
    env = tracking.environment(str(paths.run_dir), 0)
    assert "MLFLOW_RUN_ID" not in env and env[tracking.DROPPED_ENV] == "mlflow"
    opened = tracking.Trackers.open(paths.run_dir)
    assert opened is not None and opened.backends == [] and opened.dropped == {"mlflow": "TimeoutError"}
    tracking.finish_run(str(paths.run_dir))
    monkeypatch.setenv(tracking.DROPPED_ENV, env[tracking.DROPPED_ENV])  # the user's command's own process
    monkeypatch.setattr(tracking, "_dropped", {})
    assert tracking.Trackers.open(paths.run_dir) is not None
    answer.set()
    assert tried == ["http://127.0.0.1:9"], "one wait on it, for the whole start"


def test_the_trackers_open_side_by_side_under_one_bound(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Two trackers that never answer are waited for once together, not one bound after the other:
    the waits given to their threads add up to one bound."""
    import threading

    monkeypatch.setattr(tracking, "OPEN_TIMEOUT_S", 1.0)
    answer = threading.Event()
    waits: list[float] = []

    class Recorded(threading.Thread):
        def join(self, timeout: float | None = None) -> None:
            waits.append(float(timeout or 0.0))
            super().join(timeout)

    monkeypatch.setattr(tracking.threading, "Thread", Recorded)
    monkeypatch.setattr(tracking.tracker_backends, "for_run", lambda info, resumed: iter(
        [("mlflow", answer.wait), ("wandb", answer.wait)]))
    paths = run_folder(tmp_path, {"mlflow": "http://127.0.0.1:9", "wandb": "offline"})
    opened = tracking.Trackers.open(paths.run_dir)
    answer.set()
    assert opened is not None and opened.dropped == {"mlflow": "TimeoutError", "wandb": "TimeoutError"}
    assert len(waits) == 2 and sum(waits) < 1.5 * tracking.OPEN_TIMEOUT_S, waits
