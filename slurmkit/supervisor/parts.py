"""A heterogeneous job's supervisor (spec components): one srun step per part, `--het-group=N`,
all waited on together by this one process, the job's one decider:

    LAUNCH (every part) -> RUNNING -> a part's step ends -> RUNNING ... -> DONE

- Each part's step is its own world (its SLURM_PROCID and SLURM_NTASKS, its own MASTER_PORT:
  ports.training_port(job, N)) in its own run folder, and knows every part's nodes
  (common.components: SLURMKIT_<NAME>_HOST, SLURMKIT_COMPONENT, ...).
- Slurm's signal (the profile's, --signal=B:SIG) goes on to every part's step at once; once all have
  ended, the stop is decided once, on the primary part's record, as for a one-step job
  (loop.after_stop: a requeue of the whole job).
- The primary part completing completes the job: the parts still running are ended.
- A part that fails (a non-zero exit, not a stop) is one StepFailed for the restart policy, gathered
  from that part's own folder and decided on the run's record. RESTART_IN_JOB starts that part alone
  again (its next attempt) while the others run on; any other decision first stops the other parts
  with the profile's signal (so that those with an agreed stop save), then its effects (a requeue)
  are carried out.

Every transition is one JSON line in the run's supervisor.jsonl, with the part's name.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from contextlib import suppress
from pathlib import Path

from slurmkit.common import components, outcomes, ports
from slurmkit.common.layout import RunPaths
from slurmkit.common.supervisor_plan import Plan
from slurmkit.slurm import steps
from slurmkit.slurm.steps import Container
from slurmkit.supervisor import effects
from slurmkit.supervisor.decision import Action, Decision
from slurmkit.supervisor.loop import after_stop, decide, event, exit_status, say, stop_of
from slurmkit.supervisor.signal_inbox import SignalInbox

STOP_GRACE_S = 120.0
"""How long a part asked to stop (its agreed stop and save) may take before its step is ended."""


class PartsSupervisor:
    def __init__(self, plan: Plan, paths: RunPaths, job_id: str, container: Container) -> None:
        self.plan, self.paths, self.job_id, self.container = plan, paths, job_id, container
        self.names = [p.name for p in plan.parts]
        self.primary = next(i for i, p in enumerate(plan.parts) if p.primary)
        self.shared = components.variables(self.names, os.environ)
        self.attempts = [0] * len(plan.parts)
        self.running: dict[int, subprocess.Popen[bytes]] = {}
        self.exits: dict[int, int] = {}
        """Each part's last step's exit status."""
        self.signalled = False
        """Slurm's signal came and went on to every part: their ends are that stop."""
        self.terminated = False
        """Slurm's SIGTERM came: the job is ending, by Slurm's hand."""
        self.ended_by: Decision | None = None
        """A part's failure decided other than RESTART_IN_JOB: the job ends with it."""
        self.completing = False
        """The primary part has completed: the others' ends (they are being ended) are no failures."""

    def run(self) -> int:
        self._forwarded = int(getattr(signal, f"SIG{self.plan.signal}"))
        self._inbox = SignalInbox((self._forwarded, int(signal.SIGTERM))).install()
        for group in range(len(self.names)):
            self._launch(group)
        while self.running:
            for group, rc in self._wait_any():
                self._ended(group, rc)
        rc = self._outcome()
        self._event("state", state="done", exit_code=rc)
        return rc

    # -- steps ----------------------------------------------------------------------------------
    def _launch(self, group: int) -> None:
        env = {**self.shared, components.COMPONENT_ENV: self.names[group],
               "MASTER_PORT": str(ports.training_port(self.job_id, group)),
               outcomes.ATTEMPT_ENV: str(self.attempts[group])}
        self._event("launch", part=self.names[group], part_attempt=self.attempts[group])
        self.running[group] = steps.start(steps.part(self.plan, group, self.container, self.job_id), env)

    def _wait_any(self) -> list[tuple[int, int]]:
        """The parts whose steps ended, with their exit statuses; Slurm's signal meanwhile goes on to
        every part's step."""
        fds: dict[int, int] = {}
        try:
            for group, proc in self.running.items():
                with suppress(OSError):  # a kernel before 5.3: the 1 s select timeout polls instead
                    fds[group] = os.pidfd_open(proc.pid)
            while True:
                select.select([self._inbox.fd, *fds.values()], [], [], 1.0)
                self._take_signals()
                ended = [(g, exit_status(p.returncode)) for g, p in self.running.items() if p.poll() is not None]
                if ended:
                    for group, rc in ended:
                        del self.running[group]
                        self.exits[group] = rc
                    return ended
        finally:
            for fd in fds.values():
                os.close(fd)

    def _take_signals(self) -> None:
        for signum in self._inbox.take():
            forward = signum == self._forwarded
            self.terminated = self.terminated or signum == signal.SIGTERM
            self.signalled = self.signalled or forward
            say(f"caught {signal.Signals(signum).name}" + (", forwarding to every part" if forward else ""))
            self._event("signal", signal=signal.Signals(signum).name, forwarded=forward)
            if forward:
                for proc in self.running.values():
                    proc.send_signal(signum)

    # -- a part's end ---------------------------------------------------------------------------
    def _ended(self, group: int, rc: int) -> None:
        name = self.names[group]
        by_job = self.signalled or self.terminated or self.ended_by is not None or self.completing
        self._event("part_ended", part=name, exit_code=rc, part_attempt=self.attempts[group], by_job=by_job)
        if by_job:
            return  # the job is stopping or done: every part's end is that, decided once they all have ended
        if rc == 0:
            if group == self.primary and self.running:
                self.completing = True
                say(f"{name} has completed: ending the other parts")
                for proc in self.running.values():
                    steps.end(proc)
            return
        decision = self._decide(group, rc)
        if decision.action is Action.RESTART_IN_JOB:
            self.attempts[group] += 1
            self._launch(group)
        else:
            self.ended_by = decision

    def _decide(self, group: int, rc: int) -> Decision:
        """The restart policy on part `group`'s failure, gathered from its own folder and attempt."""
        part_paths = RunPaths(Path(self.plan.parts[group].run_dir))
        saved = os.environ.get(outcomes.ATTEMPT_ENV)
        os.environ[outcomes.ATTEMPT_ENV] = str(self.attempts[group])  # the policy's outcomes.attempt()
        try:
            return decide(self.paths, self.job_id, lambda: effects.step_failed(part_paths, self.job_id, rc),
                          effects.read_allocation(self.job_id, None, None, group=group),
                          said=f"part {self.names[group]} failed (exit {rc}); ", attempt=self.attempts[group],
                          before=self._stop_others)
        finally:
            os.environ[outcomes.ATTEMPT_ENV] = saved or "0"

    def _stop_others(self, decision: Decision) -> None:
        """Before a decision that ends the job: the other parts stop at an agreed step (the profile's
        signal) and save, within STOP_GRACE_S, or their steps are ended."""
        if decision.action is Action.RESTART_IN_JOB or not self.running:
            return
        say(f"stopping {', '.join(self.names[g] for g in self.running)} first")
        for proc in self.running.values():
            proc.send_signal(self._forwarded)
        deadline = time.monotonic() + STOP_GRACE_S
        for group, proc in list(self.running.items()):
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                steps.end(proc)
                proc.wait()
            self.exits[group] = exit_status(proc.returncode)
            del self.running[group]
            self._event("part_ended", part=self.names[group], exit_code=self.exits[group],
                        part_attempt=self.attempts[group], by_job=True)

    # -- the job's end --------------------------------------------------------------------------
    def _outcome(self) -> int:
        """The supervisor's exit status: a stop decided once on the primary part's record; a failure
        decided before (its requeue carried out); else the primary part's exit."""
        rc = self.exits.get(self.primary, 1)
        if self.ended_by is not None:
            return 0 if self.ended_by.action is Action.COMPLETE else max(1, rc)
        if not (self.signalled or self.terminated):
            return rc
        stopped = stop_of(self.paths, self.job_id, self.attempts[self.primary], rc, self.terminated)
        if stopped is None:  # the primary part ended on its own meanwhile: its exit says how
            return rc
        after_stop(self.paths, self.job_id, stopped)
        return 0

    def _event(self, kind: str, **fields: object) -> None:
        event(self.paths, self.job_id, kind, attempt=self.attempts[self.primary], **fields)
