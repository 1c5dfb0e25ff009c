"""One incarnation of a training run (a process's life in one allocation): resume, record its
restart, restart warm after an exception, stop with the other ranks and record the stop."""

from __future__ import annotations

import time
from pathlib import Path

import torch.distributed as tdist

from slurmkit.common import outcomes
from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import HangMarker, StopMarker
from slurmkit.common.record import RestartEntry, RunFile
from slurmkit.common.slurm_env import slurm_job_id
from slurmkit.config.train import TrainConfig
from slurmkit.jsontypes import JsonObject
from slurmkit.supervisor import effects, policy, restarts
from slurmkit.supervisor.decision import Action, Decision
from slurmkit.worker.checkpoint.checkpointer import checkpoint_uri
from slurmkit.worker.checkpoint.store import CheckpointStore, trainer_files
from slurmkit.worker.checkpoint.threads import Prefetch
from slurmkit.worker.ft.stop import Stop
from slurmkit.worker.interrupt import ended
from slurmkit.worker.process_group import Dist
from slurmkit.worker.train import warm
from slurmkit.worker.train.faults import FaultInjection
from slurmkit.worker.train.trainer import Trainer
from slurmkit.worker.train.trainer_ft import TrainerFT


def start_prefetch(run_dir: str | None, parallel: str = "ddp") -> Prefetch | None:
    """Begin reading the newest valid checkpoint now, before torch.distributed and the model are up."""
    uri = checkpoint_uri(run_dir)
    return Prefetch(CheckpointStore(uri, trainer_files(parallel))) if uri else None


class BudgetSpent(RuntimeError):
    """This run was requeued more often for one cause than its profile allows."""


class Incarnation:
    def __init__(self, dist: Dist, run_dir: str | None, cfg: TrainConfig, prefetch: Prefetch | None = None) -> None:
        """`prefetch`: the checkpoint search already started (see `start_prefetch`), else started here."""
        self.dist, self.cfg = dist, cfg
        self.paths = RunPaths(Path(run_dir)) if run_dir else None
        # A Slurm job's ranks, whether srun or a torchrun inside srun started them (launcher: torchrun).
        self.job_id = (slurm_job_id() or None) if dist.env.launcher in ("slurm", "torchrun") else None
        self.faults = FaultInjection(cfg.faults, run_dir, dist.is_main)
        uri = checkpoint_uri(run_dir)
        # FSDP2's modules hold the process group they were sharded over: a rebuilt group would need a
        # new model, so an exception under fsdp restarts the processes (cold).
        self.warm = bool(cfg.warm_restart and uri and self.paths and self.job_id and warm.possible(dist)
                         and cfg.parallel == "ddp")
        """Exceptions restart in the process (slurmkit.worker.train.warm); Slurm's policy decides, so only in a job."""
        self.ft = TrainerFT(dist, uri, cfg.checkpoint_every, cfg.keep_latest_k, cfg.async_save,
                            cfg.hang_timeout_s or None, self._on_hang, prefetch, self.faults, self._on_stop,
                            host_copy=self.warm, sharded=cfg.parallel == "fsdp") if uri else None
        self.restart: RestartEntry | None = None

    def _on_stop(self, step: int) -> None:
        if self.paths is not None and self.dist.is_main:
            StopMarker(step, time.time()).write(self.paths)

    def _on_hang(self, idle_s: float) -> None:
        if self.paths is not None:
            HangMarker.now(self.dist.rank, idle_s).write(self.paths)

    def attach(self, trainer: Trainer) -> None:
        resumed = self.ft.restore(trainer) if self.ft else None
        if self.ft:
            self.ft.attach(trainer)
        self.faults.attach(trainer, self.ft.stop.flag if self.ft else None, self.ft.watchdog if self.ft else None)
        if not (self.dist.is_main and self.paths and self.job_id):
            return
        count, attempt = outcomes.restart_count(), outcomes.attempt()
        if count and not attempt:
            self.restart = restarts.record_restart(self.paths, self.job_id, count, resumed)
        else:  # recorded before it ran: an in-job restart (the supervisor) or a resubmit (the login node)
            self.restart = restarts.note_resumed(self.paths, self.job_id, count, attempt, resumed)
        if self.restart is None:
            return
        what = f"in-job restart {attempt}" if attempt else f"restart {count}"
        print(f"slurmkit: {what}, cause {self.restart.cause} ({self.restart.detail}), "
              f"resumed at step {resumed}", flush=True)
        final = RunFile(self.paths).read().final
        if final:
            raise BudgetSpent(f"not continuing: {final}")

    def fit(self, trainer: Trainer) -> JsonObject:
        """trainer.fit(), restarted in the process after an exception while the policy allows (a
        warm restart); otherwise the exception goes on, and the supervisor takes over (cold)."""
        while True:
            try:
                return trainer.fit()
            except Exception as exc:
                failed_at = time.time()
                decision = self._agree_warm(trainer, exc)
                if not decision.restart:
                    raise
            self._restart_warm(trainer, failed_at, decision)

    def _agree_warm(self, trainer: Trainer, error: Exception) -> warm.Verdict:
        """Whether every rank is to restart warm, and from what (else the cold path)."""
        ft = self.ft
        if not self.warm or ft is None or ft.ckpt.committed is None or self.paths is None or self.job_id is None:
            return warm.Verdict(False)
        paths, job_id, copy = self.paths, self.job_id, ft.ckpt.committed

        def decide(reports: list[warm.Report], live: int | None) -> Decision | None:
            signature, detail = warm.cause_of(reports)
            resumed = live if live is not None else copy.step if copy.on_disk else None
            raised = policy.RankRaised(trainer.state.step, signature, detail, resumed, live is not None)
            decision = effects.decide(paths, job_id, raised)
            return decision if decision.action is Action.RESTART_WARM else None

        report = warm.report_of(self.dist.rank, error, ft.live_step(trainer))
        trainer.unwrap()  # the wrapper's group is about to go
        return warm.agree(self.dist, report, decide, warm.report_wait_s(trainer.median_step_s()),
                          ft.watchdog.progress, lambda: ft.stop.flag.kind == Stop.TERMINATE)

    def _restart_warm(self, trainer: Trainer, failed_at: float, decision: warm.Verdict) -> None:
        assert self.ft is not None
        if decision.live_step is not None:
            step, source = self.ft.restore_live(trainer), "the live state (no step lost)"
        else:
            copy = self.ft.restore_from_host(trainer)
            step, source = copy.step, f"host memory ({'committed' if copy.on_disk else 'the initial state'})"
        warm.rebuild(trainer)
        trainer.hooks.append(warm.first_step_hook(failed_at, step))
        if self.dist.is_main:
            print(f"slurmkit: warm restart: back at step {step} from {source}, group generation "
                  f"{self.dist.group.generation if self.dist.group else 0}", flush=True)

    @property
    def stopped(self) -> bool:
        return self.ft is not None and self.ft.stop.stopped_at is not None

    def finish(self) -> None:
        if self.ft:
            self.ft.finish()

    def close(self) -> None:
        """However training ended: the watchdog stands down (it must not kill a process that goes on)."""
        if self.ft:
            self.ft.watchdog.stop()

    def stop_and_exit(self, trainer: Trainer) -> None:
        """After the final save: rank 0 records the stop for the job's supervisor (interrupt.ended), which
        decides whether the job is requeued; then every rank exits."""
        assert self.ft is not None
        line, status = ended(str(self.paths.run_dir) if self.paths else None, trainer.state.step,
                             self.ft.stop.kind == Stop.REQUEUE, self.dist.is_main)
        if self.dist.is_main:
            print(f"slurmkit: {line}", flush=True)
        if self.dist.world_size > 1:
            tdist.barrier()
        # Not an exception: submitit must not record a result (or an error) for this incarnation.
        raise SystemExit(status)

    @property
    def resumed_step(self) -> int | None:
        """The step this incarnation restored; None when it started fresh or keeps no checkpoints."""
        return self.ft.ckpt.resumed_step if self.ft else None

    def summary(self) -> JsonObject:
        out: JsonObject = {}
        if self.ft:
            out.update(resumed_from_step=self.resumed_step,
                       checkpoint_stall_s=round(self.ft.ckpt.stall_s, 4))
        if self.paths and self.paths.record.exists():
            restarts = RunFile(self.paths).read().restarts
            out.update(restarts=len(restarts), restart_causes=[r.cause for r in restarts],
                       in_job_restarts=sum(1 for r in restarts if r.in_job),
                       warm_restarts=sum(1 for r in restarts if r.kind == "warm"))
        return out
