"""The run folder's layout: the paths of one run (RunPaths), all but the run's secret (slurmkit.trust)
and Ray's token (worker.ray_driver).

Both sides use it: the client creates and reads run folders (slurmkit.runs.registry), the job's
supervisor and ranks write into them. docs/design.md has who owns each file.
"""

from __future__ import annotations

import os
import pwd
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurmkit import trust
from slurmkit.common import outcomes
from slurmkit.common.outcomes import Outcome
from slurmkit.errors import ConfigError, clip

RUN_FILE = "run.json"
_VAR_RE = re.compile(r"\$(\w+|\{[^}]*\})")


def expand_vars(value: str, field: str) -> str:
    """$VARS of the login node's environment expanded; one left unset is an error naming it. A
    literal `$USER` folder (what os.path.expandvars leaves) is never what the user meant. $USER and
    $LOGNAME, unset (cron, a container, `env -i`), are the caller's own name, as the shell's `id -un`."""
    expanded = _VAR_RE.sub(_caller_name, value)
    expanded = os.path.expandvars(expanded)
    unset = _VAR_RE.search(expanded)
    if unset:
        raise ConfigError(f"{unset.group(0)} is not set in this environment", where=f"profile:{field}={clip(value)}",
                          valid="valid: set it before running slurmkit, or write the path out")
    return expanded


def _caller_name(m: re.Match[str]) -> str:
    name = m.group(1).strip("{}")
    if name in ("USER", "LOGNAME") and not os.environ.get(name):
        return pwd.getpwuid(os.getuid()).pw_name
    return m.group(0)


OBJECT_STORES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs",
                 "abfss": "adlfs"}
"""fsspec protocols whose root's first part is a bucket, and the package each needs."""


def expand_root(run_root: str) -> Path:
    """The run root as an absolute path (~ and $VARS expanded on the login node)."""
    root = Path(os.path.expanduser(expand_vars(run_root, "run_root")))
    if not root.is_absolute():
        raise ConfigError("run_root is a relative path: it would depend on the folder slurmkit runs in",
                          where=f"profile:run_root={clip(run_root)}",
                          valid="valid: an absolute path, ~/... or $VAR/...")
    return root


def expand_checkpoint_root(checkpoint_root: str) -> str:
    """checkpoint_root with $VARS expanded (a path or an fsspec URL), without a trailing /."""
    return expand_vars(checkpoint_root, "checkpoint_root").rstrip("/")


@dataclass(frozen=True)
class RunPaths:
    """Every path of one run."""

    run_dir: Path

    @property
    def run_id(self) -> str:
        return self.run_dir.name

    def part(self, name: str, primary: bool = False) -> RunPaths:
        """A heterogeneous run's part's own run folder (spec components): the run's own for its
        primary part, else parts/NAME inside it."""
        return self if primary else RunPaths(self.run_dir / "parts" / name)

    @property
    def record(self) -> Path:
        return self.run_dir / RUN_FILE

    @property
    def script(self) -> Path:
        return self.run_dir / "sbatch.sh"

    @property
    def job_folder(self) -> Path:
        """submitit's folder: pickles, results and per-rank logs."""
        return self.run_dir / "submitit"

    @property
    def metrics(self) -> Path:
        return self.run_dir / "metrics.jsonl"

    @property
    def logged(self) -> Path:
        """What the run's own code logs (slurmkit.tracking.log; Lightning's and the HF Trainer's
        logged metrics), one JSON line a call: `step`, `time` and the values. metrics.jsonl is the
        Trainer's step accounting, which goodput reads; this file is not."""
        return self.run_dir / "logged.jsonl"

    def gpu_metrics(self, host: str) -> Path:
        """GPU samples of one node (each node's first rank writes its own file)."""
        return self.run_dir / f"metrics-gpu-{host}.jsonl"

    @property
    def tensorboard(self) -> Path:
        """TensorBoard event files (tracking.tensorboard), one file per incarnation."""
        return self.run_dir / "tensorboard"

    @property
    def tracking_state(self) -> Path:
        """Rank 0's note of how many of run.json's restarts the trackers were told of (worker.tracking)."""
        return self.run_dir / "tracking.json"

    @property
    def tracking_dir(self) -> Path:
        """Where a tracker keeps its own files for the run: W&B's wandb/ folder is made inside it."""
        return self.run_dir

    @property
    def code_dir(self) -> Path:
        """The code snapshot every incarnation runs from (profile or spec `snapshot: true`)."""
        return self.run_dir / "code"

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def compile_cache(self) -> Path:
        """Inductor's caches of a run with config.compile (profile compile_cache: run): every
        incarnation of the run loads what the first compiled (slurmkit.worker.train.fast_paths)."""
        return self.run_dir / "compile-cache"

    def checkpoint_uri(self, checkpoint_root: str | None, key: str | None = None) -> str:
        """Where this run's checkpoints go: <checkpoint_root>/<key or run_id>, or the run folder's checkpoints/."""
        if checkpoint_root:
            return f"{expand_checkpoint_root(checkpoint_root)}/{key or self.run_id}"
        return str(self.checkpoints)

    @property
    def resume_call(self) -> Path:
        """A submitit Checkpointable's `checkpoint()` answer at the last stop (slurmkit.worker.ft.checkpointable):
        what the next incarnation calls instead of the submitted function."""
        return self.run_dir / "resume-call.pkl"

    @property
    def restart_request(self) -> Path:
        """Why the running job asked to be requeued; read and removed by the next incarnation."""
        return self.run_dir / "restart-request.json"

    @property
    def prune_request(self) -> Path:
        """A search's pruner stopped this trial (common.markers.PruneRequest): it must not restart."""
        return self.run_dir / "prune-request.json"

    @property
    def stop_marker(self) -> Path:
        """The step the ranks agreed to stop at, written before its save: if the save never ends
        (killed after GraceTime) the next incarnation still knows how far the last one got."""
        return self.run_dir / "stopping.json"

    @property
    def stopped(self) -> Path:
        """How the ranks' step ended when they stopped on a signal (common.markers.Stopped)."""
        return self.run_dir / "stopped.json"

    @property
    def supervisor_events(self) -> Path:
        """The job's supervisor's states and decisions, one JSON line each (slurmkit.supervisor.loop)."""
        return self.run_dir / "supervisor.jsonl"

    @property
    def local_supervisor_log(self) -> Path:
        """A local heterogeneous run's supervisor's lines (supervisor.local_parts; on Slurm the batch log has them)."""
        return self.job_folder / "local_supervisor.log"

    @property
    def straggler_marker(self) -> Path:
        """The ranks rank 0 names as stragglers now (common.markers.Stragglers)."""
        return self.run_dir / "stragglers.json"

    @property
    def stage_log(self) -> Path:
        """Each node's staging at each start of the job, one JSON line each (profile stage)."""
        return self.run_dir / "stage.jsonl"

    @property
    def straggler_scores(self) -> Path:
        """Rank 0's straggler readings over time, one JSON line each (worker.ft.straggler)."""
        return self.run_dir / "scores.jsonl"

    @property
    def startup_marker(self) -> Path:
        """Rank 0's startup watch: when it began, and when its first step came (common.markers.StartupWatched)."""
        return self.run_dir / "startup.json"

    def hang_marker(self, rank: int) -> Path:
        return self.run_dir / f"hang-rank{rank}.json"

    def hang_markers(self) -> list[Path]:
        """Every rank's hang marker present, by rank."""
        return sorted(self.run_dir.glob("hang-rank*.json"))

    def standby_go(self, job_id: str, restart_count: int, attempt: int) -> Path:
        """The requeue policy hands in-job attempt `attempt` of incarnation `restart_count` of the job
        to its standby ranks (slurmkit.worker.standby): a later incarnation, or a resubmitted job,
        has standby ranks of its own."""
        return self.run_dir / f"standby-go-{job_id}.{restart_count}.{attempt}"

    def injected_marker(self, step: int) -> Path:
        """A one-shot fault injected at `step` has fired (config.faults.transient_error_at_steps)."""
        return self.run_dir / f"injected-step{step}"

    def command_stop(self, job_id: str, rank: int) -> Path:
        """Rank `rank`'s command announces its slurmkit.Checkpoint here, then the step it stopped at."""
        return self.run_dir / f"command-stop-{job_id}.{rank}.json"

    def rank_process(self, job_id: str, rank: int) -> Path:
        """Where rank `rank` of job `job_id` runs (host and pid), for `slurmkit stack`."""
        return self.run_dir / f"rank-process-{job_id}.{rank}.json"

    def health_marker(self, node: str) -> Path:
        """Why `node` failed the health gate (written by the gate, read by the requeue)."""
        return self.run_dir / f"health-{node}.json"

    def health_markers(self) -> list[Path]:
        return sorted(self.run_dir.glob("health-*.json"))

    @property
    def report(self) -> Path:
        """Where `slurmkit report` draws the run unless told otherwise."""
        return self.run_dir / "report.png"

    def result_pickle(self, job_id: str, rank: int) -> Path:
        """submitit's per-rank result: ("success", value) or ("error", traceback). Read only by `result`."""
        return self.job_folder / f"{job_id}_{rank}_result.pkl"

    def outcome_file(self, job_id: str, rank: int) -> Path:
        """A rank's outcome as JSON (slurmkit.common.outcomes), written when the rank finishes."""
        return self.run_dir / "outcomes" / f"{job_id}_{rank}.json"

    def outcome_ranks(self, job_id: str) -> list[int]:
        """The ranks of job `job_id` that wrote an outcome record, in order."""
        try:
            names = os.listdir(self.run_dir / "outcomes")
        except OSError:
            return []
        prefix = f"{job_id}_"
        return sorted(int(n[len(prefix):-5]) for n in names
                      if n.startswith(prefix) and n.endswith(".json") and n[len(prefix):-5].isdigit())

    def outcome(self, job_id: str, rank: int) -> Outcome | None:
        """A rank's outcome, or None when it wrote none (still running, requeued, killed)."""
        return outcomes.read(self.outcome_file(job_id, rank))

    def outcome_state(self, job_id: str, num_tasks: int) -> str:
        """What the ranks' outcome records say of an ended job: COMPLETED (every rank succeeded),
        FAILED (one recorded an error), else UNKNOWN. For a job neither squeue nor sacct knows (no
        accounting, or sacct failing), as for a local run."""
        # Only the records present are read (one listing): a record's num_tasks never costs a stat per rank.
        found = [self.outcome(job_id, t) for t in self.outcome_ranks(job_id) if t < num_tasks]
        if len(found) == num_tasks and all(o is not None and o.ok for o in found):
            return "COMPLETED"
        return "FAILED" if any(o is not None and not o.ok for o in found) else "UNKNOWN"

    def unpickle_result(self, job_id: str, rank: int) -> tuple[str, Any]:
        """submitit's result pickle, only from a folder the caller owns and no one else can write,
        checked on the open file (one open: nothing can be swapped in between)."""
        # A sweep task's submitit/ is a link to the sweep's own: load_pickle follows links to the folders.
        outcome, value = trust.load_pickle(self.result_pickle(job_id, rank), "the result",
                                           (self.run_dir, self.job_folder))
        return str(outcome), value

    def rank_log(self, job_id: str, rank: int | str, stream: str = "out") -> Path:
        """submitit's per-rank log name (its JobPaths layout: JOBID_RANK_log.out); with Slurm's
        patterns (%j or %A_%a, %t) for arguments, the pattern the batch script names."""
        return self.job_folder / f"{job_id}_{rank}_log.{stream}"

    def rank_logs(self, job_id: str) -> dict[int, Path]:
        found: dict[int, Path] = {}
        for f in self.job_folder.glob(f"{job_id}_*_log.out"):
            rank = f.name[len(job_id) + 1 :].split("_", 1)[0]
            if rank.isdigit():
                found[int(rank)] = f
        return dict(sorted(found.items()))
