"""The job's supervisor: on the batch host, torch-free, the last line of the batch script
(`exec python -P -m slurmkit.supervisor ...`). It runs the ranks for the whole incarnation:

    HEALTH_GATE -> LAUNCH -> RUNNING -> DECIDING -> LAUNCH (restart in the job) | DONE

- HEALTH_GATE (where the profile asks): one check per node; a failing node requeues the job
  without it (a HealthFailed event) and the supervisor exits 1.
- LAUNCH: one srun step of the ranks (slurm.steps), or the standby step taking over; beside it,
  once the ranks' first step is done (supervisor.watch), the standby step for the next attempt,
  where the profile has standby ranks.
- RUNNING: wait for the step, and watch it from outside (supervisor.watch): a startup hang no rank
  can report ends the step; a straggler named for the profile's straggler_patience_s is asked of
  the policy, and REPLACE_IN_JOB stops the ranks at an agreed step (the profile's signal) and
  starts the next attempt without its node. Slurm's batch signal (the profile's, --signal=B:SIG) comes to this
  process; its handler only sets a flag, and the loop passes the signal on to the ranks' step.
  SIGTERM is noted and not passed on: Slurm sends it to the ranks' step itself, and this process
  must outlive it to decide once the ranks have saved. After it, the step's end is that stop,
  never a failure to restart or requeue (a scancel is not a crash).
- DECIDING: the ranks stopped on a signal (rank 0's record, common.markers.Stopped: a StepStopped
  event), and the supervisor exits 0 once it is decided; or the step exited non-zero (StepFailed).
  The pure policy (supervisor.policy.decide) answers with a Decision, whose effects the decider's
  hands carry out (supervisor.effects). RESTART_IN_JOB starts the next attempt (on the Decision's
  nodes, for a job that shrinks); COMPLETE exits 0; REQUEUE and END exit with the step's status.

This process is the one decider of a restart in the job or a requeue, whatever the run kind (a Ray
run's batch shell, which has no supervisor loop, asks `--after-stop` of it once its driver ended).

Every transition is one JSON line in the run folder's supervisor.jsonl (RunPaths.supervisor_events).
"""

from __future__ import annotations

import enum
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from slurmkit import trust
from slurmkit.common import outcomes, ports
from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import StandbyGo, Stopped
from slurmkit.common.record import RunFile
from slurmkit.common.slurm_env import expand_hostlist
from slurmkit.common.supervisor_plan import Plan
from slurmkit.errors import SlurmkitError
from slurmkit.slurm import steps
from slurmkit.slurm.steps import Container
from slurmkit.supervisor import effects
from slurmkit.supervisor.allocation import Allocation
from slurmkit.supervisor.decision import Action, Decision
from slurmkit.supervisor.policy import Event, StragglerLasted
from slurmkit.supervisor.signal_inbox import SignalInbox
from slurmkit.supervisor.watch import OutsideWatch


class State(enum.StrEnum):
    HEALTH_GATE = "health_gate"
    LAUNCH = "launch"
    RUNNING = "running"
    DECIDING = "deciding"
    DONE = "done"


def exit_status(returncode: int) -> int:
    """A step's status as a shell reports it: 128 + N for a step killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


class Supervisor:
    def __init__(self, plan: Plan, paths: RunPaths, job_id: str, container: Container) -> None:
        self.plan, self.paths, self.job_id, self.container = plan, paths, job_id, container
        self.state = State.LAUNCH
        self.attempt = 0
        os.environ[outcomes.ATTEMPT_ENV] = "0"
        self.nodes = plan.shrink.nodes if plan.shrink else None
        self.exclude: tuple[str, ...] = ()
        self._standby: subprocess.Popen[bytes] | None = None
        self.avoided: tuple[str, ...] = ()
        """Nodes this job's later steps leave out: stragglers replaced (REPLACE_IN_JOB)."""
        self.replacing: Decision | None = None
        """REPLACE_IN_JOB decided in this attempt: once the ranks have stopped, the next attempt starts."""
        self.terminated = False
        """Slurm's SIGTERM came: the job is ending, by Slurm's hand (_stop_of)."""
        if plan.launcher == "torchrun":  # c10d on the first node; the job's own id, as MASTER_PORT is picked
            first = expand_hostlist(os.environ.get("SLURM_JOB_NODELIST", ""))[:1] or ["localhost"]
            os.environ["SLURMKIT_RDZV_ENDPOINT"] = f"{first[0]}:{ports.training_port(os.environ['SLURM_JOB_ID'])}"

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> int:
        self._install_signal()
        if self.plan.health is not None and not self._health_gate():
            return 1
        taken: subprocess.Popen[bytes] | None = None
        try:
            while True:
                self._enter(State.LAUNCH)
                ranks = taken if taken is not None else self._launch()
                self._enter(State.RUNNING)  # the standby step starts once the ranks' first step is done
                rc = self._wait(ranks, self._outside_watch())
                stopped = self._stop_of(rc)
                if stopped is not None and self.replacing is not None and not self.terminated:
                    self._enter(State.DECIDING, exit_code=rc)  # decided already: the stop was the replacement's
                    self._next_attempt(self.replacing, None)
                    taken = None
                    continue
                if stopped is not None:  # the ranks stopped as asked (and saved): not a failure
                    self._enter(State.DECIDING, exit_code=rc)
                    after_stop(self.paths, self.job_id, stopped)
                    rc = 0
                    break
                if rc == 0:
                    break
                self._enter(State.DECIDING, exit_code=rc)
                taken = self._standby if self._standby is not None and self._standby.poll() is None else None
                decision = self._decide(rc)
                if decision.action is Action.COMPLETE:
                    rc = 0
                if decision.action is not Action.RESTART_IN_JOB:
                    break
                self._next_attempt(decision, taken)
        finally:
            self._end_standby()
        self._enter(State.DONE, exit_code=rc)
        return rc

    def _stop_of(self, rc: int) -> Stopped | None:
        return stop_of(self.paths, self.job_id, self.attempt, rc, self.terminated)

    def _allocation(self) -> Allocation | None:
        least = self.plan.shrink.least if self.plan.shrink else None
        return effects.read_allocation(self.job_id, self.nodes, least, self.avoided)

    def _decide(self, rc: int) -> Decision:
        return decide(self.paths, self.job_id, lambda: effects.step_failed(self.paths, self.job_id, rc),
                      self._allocation(), said=f"ranks failed (exit {rc}); ", attempt=self.attempt)

    def _outside_watch(self) -> OutsideWatch:
        profile = RunFile(self.paths).read().profile
        patience = profile.straggler_patience_s if profile.straggler_action == "replace" else None
        return OutsideWatch(self.paths, self.job_id, self.attempt, time.time(), patience)

    def _look(self, watch: OutsideWatch, proc: subprocess.Popen[bytes]) -> None:
        """What the outside watch sees now, acted on (supervisor.watch)."""
        now = time.time()
        if self.plan.standby is not None and self._standby is None and not self.terminated \
                and watch.standby_due(now):
            self._start_standby()
        if not watch.due(now) or self.terminated or self.replacing is not None:
            return
        if (hung := watch.frozen(now)) is not None:
            hung.write(self.paths)
            say(f"no rank reached its first step within {hung.idle_s:.0f} s and none could say so: "
                 "ending the step (startup hang, seen from outside)")
            self._event("startup_hang_outside", idle_s=hung.idle_s)
            steps.end(proc)
        elif (slow := watch.lasting(now)) is not None:
            decision = decide(self.paths, self.job_id, lambda: StragglerLasted(slow, round(now - slow.since, 1)),
                              self._allocation(), attempt=self.attempt)
            if decision.action is Action.REPLACE_IN_JOB:
                self.replacing, self.avoided = decision, (*self.avoided, slow.node)
                proc.send_signal(self._forwarded)

    def _next_attempt(self, decision: Decision, taken: subprocess.Popen[bytes] | None) -> None:
        self.replacing = None
        self.attempt += 1
        os.environ[outcomes.ATTEMPT_ENV] = str(self.attempt)  # the policy's outcomes.attempt(), and the step's
        if taken is not None:  # the standby ranks take this attempt (slurmkit.worker.standby)
            StandbyGo(self.job_id, outcomes.restart_count(), self.attempt).give(self.paths)
            self._standby = None
        else:
            self._end_standby()
        if self.plan.shrink is not None:
            self.nodes, self.exclude = decision.nodes or self.nodes, decision.exclude

    # -- steps ----------------------------------------------------------------------------------
    def _launch(self) -> subprocess.Popen[bytes]:
        argv = steps.ranks(self.plan, self.container, self.nodes, self.exclude)
        self._event("launch", nodes=self.nodes, exclude=list(self.exclude))
        return steps.start(argv)

    def _start_standby(self) -> None:
        if self.plan.standby is not None:
            argv = steps.standby(self.plan, str(self.paths.run_dir), self.attempt + 1)
            self._standby = steps.start(argv)

    def _end_standby(self) -> None:
        if self._standby is not None:
            self._standby.terminate()
            self._standby.wait()
            self._standby = None

    def _health_gate(self) -> bool:
        self._enter(State.HEALTH_GATE)
        rc = self._wait(steps.start(steps.health(self.plan, str(self.paths.run_dir))))
        if rc == 0:
            return True
        decide(self.paths, self.job_id, lambda: effects.health_failed(self.paths))
        return False

    # -- waiting, and Slurm's signal --------------------------------------------------------------
    def _install_signal(self) -> None:
        """Slurm's signal (plan.signal), from here on, is noted and forwarded to the step being waited
        on; SIGTERM is noted only (Slurm signals the ranks' step itself)."""
        self._forwarded = int(getattr(signal, f"SIG{self.plan.signal}"))
        self._inbox = SignalInbox((self._forwarded, int(signal.SIGTERM))).install()

    def _wait(self, proc: subprocess.Popen[bytes], watch: OutsideWatch | None = None) -> int:
        """The step's exit status; Slurm's signal, meanwhile, goes on to the step (srun passes it to
        every task) and the wait goes on until srun itself exits. The ranks' step is watched from
        outside as well (`watch`)."""
        try:
            pidfd: int | None = os.pidfd_open(proc.pid)
        except OSError:  # a kernel before 5.3: poll instead
            pidfd = None
        try:
            while proc.poll() is None:
                ready = [self._inbox.fd] + ([pidfd] if pidfd is not None else [])
                select.select(ready, [], [], 1.0 if pidfd is not None else 0.05)
                for signum in self._inbox.take():
                    forward = signum == self._forwarded
                    self.terminated = self.terminated or signum == signal.SIGTERM
                    say(f"caught {signal.Signals(signum).name}" + (", forwarding to ranks" if forward else ""))
                    self._event("signal", signal=signal.Signals(signum).name, forwarded=forward)
                    if forward:
                        proc.send_signal(signum)
                if watch is not None:
                    self._look(watch, proc)
        finally:
            if pidfd is not None:
                os.close(pidfd)
        return exit_status(proc.returncode)

    # -- the record -----------------------------------------------------------------------------
    def _enter(self, state: State, **fields: object) -> None:
        self.state = state
        self._event("state", state=state.value, **fields)

    def _event(self, kind: str, **fields: object) -> None:
        event(self.paths, self.job_id, kind, attempt=self.attempt, **fields)


def event(paths: RunPaths, job_id: str, kind: str, attempt: int = 0, **fields: object) -> None:
    """One line of supervisor.jsonl."""
    line = {"time": round(time.time(), 3), "event": kind, "job_id": job_id,
            "restart_count": outcomes.restart_count(), "attempt": attempt, **fields}
    fd = trust.open_append(paths.supervisor_events, 0o600)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def decide(paths: RunPaths, job_id: str, gather: Callable[[], Event], alloc: Allocation | None = None,
           said: str = "", attempt: int = 0, before: Callable[[Decision], None] | None = None) -> Decision:
    """Gather the event, decide on it and carry out the effects (supervisor.effects.decide, `before`
    them its hook); the decision in supervisor.jsonl and, for people, in the job's log. A run.json
    gone or corrupt is a Decision too (END, unreadable), never a traceback."""
    try:
        decision = effects.decide(paths, job_id, gather(), alloc, before)
    except SlurmkitError as exc:
        decision = Decision(Action.END, why="unreadable", message=f"the restart policy failed: {exc.one_line()}")
    event(paths, job_id, "decision", attempt=attempt, action=decision.action.value, cause=decision.cause,
          step=decision.step, nodes=decision.nodes, exclude=list(decision.exclude), why=decision.why)
    say(said + decision.message)
    return decision


def stop_of(paths: RunPaths, job_id: str, attempt: int, rc: int, terminated: bool) -> Stopped | None:
    """How the ranks' step (attempt `attempt`, exit `rc`) ended, if by a stop. Once Slurm's SIGTERM
    has come to the supervisor (`terminated`), Slurm is ending the job (scancel, the time limit, a
    preemption): the step ended by that, whatever its exit (srun, signalled too, may be gone before
    its ranks' record), never as a failure to restart or requeue. Else rank 0's record, as a_stop
    reads it."""
    found = Stopped.read(paths, job_id, outcomes.restart_count(), attempt)
    if terminated:
        return found or Stopped(job_id, outcomes.restart_count(), attempt, None, False, time.time())
    return a_stop(found, rc)


def a_stop(stopped: Stopped | None, exit_code: int) -> Stopped | None:
    """Rank 0's stop record, where the step ended as that stop: on the requeue signal, whatever the
    step's exit code (torchrun dying under the ranks' save once made it non-zero); on SIGTERM, only
    where every rank left cleanly. srun's own SIGTERM to the other ranks, once one of them died
    (--kill-on-bad-exit), reads to them as a stop, and is the failure it follows."""
    return stopped if stopped is not None and (stopped.requeue_signal or exit_code == 0) else None


def after_stop(paths: RunPaths, job_id: str, stopped: Stopped) -> Decision:
    """The ranks stopped on a signal: what it means and whether the job is requeued."""
    return decide(paths, job_id, lambda: effects.step_stopped(job_id, stopped), said="ranks stopped; ",
                  attempt=stopped.attempt)


def say(line: str) -> None:
    print(f"slurmkit: {line}", file=sys.stderr, flush=True)
