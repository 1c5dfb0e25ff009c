"""The tracker backends (worker.tracking fans out to them): MLflow, TensorBoard, Weights & Biases,
and what they are told about the run (RunInfo).

Each is imported only when a run names it; each makes or finds the run's one tracker run.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RestartEntry, RunRecord
from slurmkit.config.tracking import Tracking
from slurmkit.jsontypes import JsonObject

MLFLOW_BATCH = 1000  # MLflow's limit of metrics in one log_batch
RUN_TAG = "slurmkit/run_id"
SWEEP_TAG = "slurmkit/sweep_id"
PARAM_CHARS = 500  # MLflow takes 6,000; a parameter longer than this is a config blob, not a knob


@dataclass(frozen=True)
class RunInfo:
    """What the trackers are told about the run, read from its run.json."""

    run_id: str
    name: str
    project: str
    tracking: Tracking
    paths: RunPaths
    params: dict[str, str]
    sweep_id: str | None = None
    sweep_index: int | None = None

    @classmethod
    def of(cls, paths: RunPaths, record: RunRecord) -> RunInfo | None:
        """None when the run names no tracker."""
        tracking = record.tracking()
        if tracking is None:
            return None
        name = record.spec.name if record.spec else record.name
        sweep = record.sweep
        return cls(record.run_id, record.name or name, tracking.project or name, tracking, paths, _params(record),
                   sweep.sweep_id if sweep else None, sweep.index if sweep else None)


def _params(record: RunRecord) -> dict[str, str]:
    flat: dict[str, str] = {}

    def put(prefix: str, value: object) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                put(f"{prefix}.{k}" if prefix else str(k), v)
        elif value is not None:
            flat[prefix] = str(value)[:PARAM_CHARS]

    spec = record.spec.model_dump() if record.spec else {}
    put("config", spec.get("config") or {})
    put("resources", record.resources.model_dump())
    for key in ("task", "command", "callable", "function", "launcher"):
        if spec.get(key):
            put(key, spec[key])
    if record.snapshot:
        put("git", {k: record.snapshot.get(k) for k in ("commit", "dirty", "origin") if k in record.snapshot})
    if record.sweep:
        put("sweep", {"index": record.sweep.index, "overrides": record.sweep.overrides})
    return flat


class Backend(Protocol):
    name: str

    def metrics(self, step: int, values: dict[str, float]) -> None: ...
    def event(self, step: int, entry: RestartEntry) -> None: ...
    def finish(self, step: int, summary: dict[str, float]) -> None: ...
    def close(self) -> None: ...


def now_ms() -> int:
    return int(time.time() * 1000)


def restart_fields(entry: RestartEntry) -> JsonObject:
    return {k: v for k, v in json.loads(entry.model_dump_json()).items() if v not in (None, "", [])}


def for_run(info: RunInfo, resumed_from: int) -> Iterator[tuple[str, Callable[[], Backend]]]:
    t = info.tracking
    if t.mlflow:
        yield "mlflow", lambda: Mlflow(info, str(t.mlflow))
    if t.tensorboard:
        yield "tensorboard", lambda: TensorBoard(info, resumed_from)
    if t.wandb:
        yield "wandb", lambda: Wandb(info)


class Mlflow:
    """The run is found by its `slurmkit/run_id` tag; a sweep's tasks are children of one parent run."""

    name = "mlflow"

    def __init__(self, info: RunInfo, uri: str) -> None:
        from mlflow.tracking import MlflowClient

        if uri.startswith(("/", "file:")):  # MLflow refuses its file store unless told this is wanted
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        # MLflow's own defaults (a 120 s timeout, 7 retries with backoff) held a run 4 min on an unreachable
        # server; the caller bounds each call anyway (tracking.bounded), these end MLflow's side sooner.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
        self.client = MlflowClient(uri)
        self.experiment = self._experiment(info.project)
        tags = {RUN_TAG: info.run_id, "mlflow.runName": info.name}
        if info.sweep_id:
            tags[SWEEP_TAG] = info.sweep_id
            tags["mlflow.parentRunId"] = self._one({SWEEP_TAG: info.sweep_id, "slurmkit/parent": "1"},
                                                   {"mlflow.runName": info.sweep_id})[0]
        self.run_id, made = self._one({RUN_TAG: info.run_id}, tags)
        if made:
            from mlflow.entities import Param

            params = [Param(k, v) for k, v in sorted(info.params.items())]
            for i in range(0, len(params), 100):  # MLflow's limit of params in one log_batch
                self.client.log_batch(self.run_id, params=params[i:i + 100])

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(self.client.create_experiment(name))
        except Exception:  # made by another run meanwhile
            again = self.client.get_experiment_by_name(name)
            if again is None:
                raise
            return str(again.experiment_id)

    def _one(self, match: dict[str, str], tags: dict[str, str]) -> tuple[str, bool]:
        """(the oldest run with the `match` tags, whether this call made it). Two makers racing each
        make one; each then takes the oldest and the later one is deleted."""
        query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in match.items())

        def oldest() -> list[Any]:
            return list(self.client.search_runs([self.experiment], query, order_by=["attributes.start_time ASC"],
                                                max_results=10))

        runs = oldest()
        if runs:
            return str(runs[0].info.run_id), False
        mine = str(self.client.create_run(self.experiment, tags={**match, **tags}).info.run_id)
        first = str(oldest()[0].info.run_id)
        if first != mine:
            self.client.delete_run(mine)
        return first, first == mine

    def metrics(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        stamp = now_ms()
        batch = [Metric(k, v, stamp, step) for k, v in values.items()]
        for i in range(0, len(batch), MLFLOW_BATCH):
            self.client.log_batch(self.run_id, metrics=batch[i:i + MLFLOW_BATCH])

    def event(self, step: int, entry: RestartEntry) -> None:
        self.client.set_tag(self.run_id, f"slurmkit/restart/{step}/{entry.kind}/{entry.n}",
                            json.dumps(restart_fields(entry)))
        self.metrics(step, {"slurmkit/restart": 1.0, "slurmkit/lost_steps": float(entry.lost_steps or 0)})

    def finish(self, step: int, summary: dict[str, float]) -> None:
        self.metrics(step, {f"final.{k}": v for k, v in summary.items()})
        self.client.set_terminated(self.run_id, "FINISHED")

    def close(self) -> None:
        """Nothing held open: a requeued run stays RUNNING for the next incarnation."""


class TensorBoard:
    """One event file per incarnation in the run's tensorboard/; a resumed one purges the steps past
    the step it resumed from, so steps run again are overwritten, not doubled."""

    name = "tensorboard"

    def __init__(self, info: RunInfo, resumed_from: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(info.paths.tensorboard), flush_secs=10,
                                    purge_step=resumed_from + 1 if resumed_from else None)
        if not resumed_from:
            rows = "\n".join(f"| {k} | {v} |" for k, v in sorted(info.params.items()))
            self.writer.add_text("slurmkit/params", f"| parameter | value |\n| --- | --- |\n{rows}", 0)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def event(self, step: int, entry: RestartEntry) -> None:
        self.writer.add_scalar("slurmkit/restart", 1.0, step)
        self.writer.add_text("slurmkit/restarts", json.dumps(restart_fields(entry)), step)
        self.writer.flush()

    def finish(self, step: int, summary: dict[str, float]) -> None:
        self.writer.add_text("slurmkit/final", json.dumps(summary), step)

    def close(self) -> None:
        self.writer.close()


class Wandb:
    """The run id is the W&B run id, resumed with resume="allow"; a sweep's tasks share its group."""

    name = "wandb"

    def __init__(self, info: RunInfo) -> None:
        import wandb

        t = info.tracking
        self.run = wandb.init(id=info.run_id, resume="allow", project=info.project, entity=t.wandb_entity,
                              group=info.sweep_id, name=info.name, dir=str(info.paths.tracking_dir), mode=t.wandb,
                              config=info.params, settings=wandb.Settings(silent=True, console="off"))

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def event(self, step: int, entry: RestartEntry) -> None:
        # W&B drops a point below the highest step it has (a crash's resume step is): the restart goes at
        # the first step W&B takes, and the count of restarts into the run's summary.
        self.run.log({"slurmkit/restart": 1.0, "slurmkit/lost_steps": float(entry.lost_steps or 0),
                      "slurmkit/resumed_step": float(step)}, step=max(step, int(self.run.step)))
        self.run.summary["slurmkit/restarts"] = int(self.run.summary.get("slurmkit/restarts", 0)) + 1

    def finish(self, step: int, summary: dict[str, float]) -> None:
        self.run.summary.update({f"final/{k}": v for k, v in summary.items()})

    def close(self) -> None:
        self.run.finish()
