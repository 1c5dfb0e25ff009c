"""A heterogeneous run on the local profile: its parts as local process groups, under this one
torch-free process, which is the local run's job (its pid the job id, as a local controller's is
for any other local run; `python -P -m slurmkit.supervisor.local_parts`, started by the submit):

    LAUNCH (every part's ranks) -> RUNNING -> a part ends -> ... -> DONE | LAUNCH (the next incarnation)

- Each part's ranks are its own world: task k of N as submitit's local controller numbers them
  (SUBMITIT_LOCAL_*), its own free MASTER_PORT, its own run folder's pickle and logs, and every
  part's whereabouts (common.components.local_variables: all on this machine). A part's GPUs are
  its own: the machine's, handed out in part order.
- The primary part completing completes the run: the others are ended (SIGTERM, then SIGKILL).
- The profile's signal, sent to this process (or due signal_delay_s before the run's time), goes
  on to every part's ranks; sent to the ranks themselves (`pkill -USR2 -P JOB`), it reaches every
  part's too. As on Slurm there is one decision: the primary part's rank 0 asks the restart policy
  (supervisor.local_requeue, as for any local run); the other parts stop without deciding
  (local_requeue.DECIDES_ENV). A requeue decided, every part starts again once all have ended: the
  run's next local incarnation, resuming from what each part saved.
- A part that fails outside a stop ends the run: the others are ended. The local profile restarts
  nothing in the job (on Slurm the restart policy decides a part's failure: supervisor.parts).
- SIGINT (`slurmkit cancel`, as to submitit's local controller) goes on to every part's ranks, and
  SIGKILL to those left END_GRACE_S later: the run ends.

Every transition is one JSON line in the run's supervisor.jsonl, with the part's name, as on Slurm
(`slurmkit status` reads each part's state from them).
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
import time
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from pathlib import Path

from slurmkit.common import components, ports
from slurmkit.common.layout import RunPaths
from slurmkit.common.procfs import group_members
from slurmkit.common.supervisor_plan import Plan
from slurmkit.supervisor.local_requeue import DECIDES_ENV, LOCAL_MAX_STARTS, LOCAL_REQUEUE_STATUS
from slurmkit.supervisor.loop import event, exit_status, say
from slurmkit.supervisor.signal_inbox import SignalInbox

END_GRACE_S = 10.0
"""How long a part's ranks have to end after SIGTERM (or the stop signal) before SIGKILL."""
POLL_S = 0.2
CANCELLED_STATUS = 128 + signal.SIGINT
"""The run's status once cancelled (SIGINT to this process: `slurmkit cancel`), whatever its parts did."""


class Ranks:
    """One part's ranks in one incarnation: a process each, children of this process (so in its
    process group: a cancel's signal to the group reaches them)."""

    def __init__(self, procs: list[subprocess.Popen[bytes]]) -> None:
        self.procs = procs

    def status(self) -> int | None:
        """None while a rank runs; then the part's: LOCAL_REQUEUE_STATUS where a rank asked for the
        next incarnation, else its first failing rank's, else 0."""
        codes = [p.poll() for p in self.procs]
        if any(c is None for c in codes):
            return None
        statuses = [exit_status(c) for c in codes if c is not None]
        if LOCAL_REQUEUE_STATUS in statuses:
            return LOCAL_REQUEUE_STATUS
        return next((s for s in statuses if s), 0)

    def failing(self) -> bool:
        """A rank has failed while others run: the part is ending (srun's --kill-on-bad-exit on Slurm)."""
        codes = [p.poll() for p in self.procs]
        return None in codes and any(c not in (None, 0, LOCAL_REQUEUE_STATUS) for c in codes)

    def send(self, signum: int) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signum)


@dataclass
class _Incarnation:
    """One incarnation's parts, while they run."""

    running: dict[int, Ranks]
    warn_at: float | None
    """When the profile's signal is due (signal_delay_s before the run's time)."""
    limit: float | None
    stopping: bool = False
    """Every part was sent a signal: their ends are that stop (or the run's end), not failures."""
    failed: int | None = None
    """The run's status where a part failed (or it was cancelled): no next incarnation."""
    primary_rc: int = 1
    kill_at: float | None = None
    """When the parts still running after an end's SIGTERM get SIGKILL."""
    ending: set[int] = field(default_factory=set)
    """The parts one of whose ranks failed: their other ranks were sent SIGTERM."""


class LocalParts:
    def __init__(self, plan: Plan, paths: RunPaths, time_s: float, signal_delay_s: float) -> None:
        self.plan, self.paths, self.job_id = plan, paths, str(os.getpid())
        self.time_s, self.signal_delay_s = time_s, signal_delay_s
        self.names = [p.name for p in plan.parts]
        self.primary = next(i for i, p in enumerate(plan.parts) if p.primary)
        self.signum = int(getattr(signal, f"SIG{plan.signal}"))
        self.shared = components.local_variables(self.names)
        first = 0
        self.gpus: list[str] = []
        for p in plan.parts:
            self.gpus.append(",".join(str(g) for g in range(first, first + p.gpus_per_node)))
            first += p.gpus_per_node

    def run(self) -> int:
        inbox = SignalInbox((self.signum, int(signal.SIGTERM), int(signal.SIGINT))).install()
        rc = LOCAL_REQUEUE_STATUS
        for incarnation in range(LOCAL_MAX_STARTS):
            with ExitStack() as logs:
                rc = self._incarnation(incarnation, inbox, logs)
            self._end_leftovers()
            if rc != LOCAL_REQUEUE_STATUS:
                break
        event(self.paths, self.job_id, "state", state="done", exit_code=rc)
        return 0 if rc == LOCAL_REQUEUE_STATUS else rc  # the budget's end: decided and written by rank 0

    def _incarnation(self, incarnation: int, inbox: SignalInbox, logs: ExitStack) -> int:
        now = time.monotonic()
        inc = _Incarnation({g: self._launch(g, incarnation, logs) for g in range(len(self.names))},
                           warn_at=now + self.time_s - self.signal_delay_s if self.time_s else None,
                           limit=now + self.time_s if self.time_s else None)
        while inc.running:
            select.select([inbox.fd], [], [], POLL_S)
            self._signals(inc, inbox.take(), time.monotonic())
            for group, ranks in list(inc.running.items()):
                if (rc := ranks.status()) is not None:
                    self._ended(inc, group, rc)
                elif ranks.failing() and group not in inc.ending:
                    inc.ending.add(group)
                    ranks.send(signal.SIGTERM)
                    inc.kill_at = inc.kill_at or time.monotonic() + END_GRACE_S
        return inc.failed if inc.failed is not None else inc.primary_rc

    def _signals(self, inc: _Incarnation, taken: list[int], now: float) -> None:
        """The signals this process took, and those the run's time and an end's grace are due: each
        goes on to every part still running."""
        if inc.warn_at is not None and now >= inc.warn_at:
            inc.warn_at = None
            taken.append(self.signum)  # as submitit's local controller does before the time limit
        if inc.limit is not None and now >= inc.limit:
            inc.limit, inc.kill_at = None, now
        if inc.kill_at is not None and now >= inc.kill_at:
            inc.kill_at = None
            taken.append(signal.SIGKILL)
        for signum in taken:
            say(f"{signal.Signals(signum).name}: sending it to every part")
            event(self.paths, self.job_id, "signal", signal=signal.Signals(signum).name, forwarded=True)
            inc.stopping = True
            if signum == signal.SIGINT:  # a cancel (runs.procs.end_group): no next incarnation
                inc.failed = CANCELLED_STATUS
                inc.kill_at = inc.kill_at or now + END_GRACE_S
            for ranks in inc.running.values():
                ranks.send(signum)

    def _ended(self, inc: _Incarnation, group: int, rc: int) -> None:
        """Part `group`'s ranks have all ended with status `rc`: what that means for the others."""
        del inc.running[group]
        by_run = inc.stopping or inc.failed is not None
        event(self.paths, self.job_id, "part_ended", part=self.names[group], exit_code=rc, part_attempt=0,
              by_job=by_run)
        inc.primary_rc = rc if group == self.primary else inc.primary_rc
        if by_run or not inc.running:
            return
        end: int = signal.SIGTERM
        grace: float | None = time.monotonic() + END_GRACE_S
        if group == self.primary and rc == LOCAL_REQUEUE_STATUS:
            # Stopped and decided (a signal sent to its ranks alone): the others stop and save too.
            say(f"{self.names[group]} stopped: stopping the other parts")
            end, grace = self.signum, None
        elif group == self.primary and rc == 0:
            say(f"{self.names[group]} has completed: ending the other parts")
        elif rc not in (0, LOCAL_REQUEUE_STATUS):
            say(f"part {self.names[group]} failed (exit {rc}): ending the other parts")
            inc.failed = rc
        else:
            return
        inc.stopping, inc.kill_at = True, grace
        for other in inc.running.values():
            other.send(end)

    def _end_leftovers(self) -> None:
        """What the ranks started and left running (a command's own children, reparented): SIGTERM,
        then SIGKILL END_GRACE_S later, so that a part's next incarnation, or the run's end, finds
        none of the last one's processes (on Slurm the step's cgroup sees to it)."""
        me = os.getpid()
        for signum in (signal.SIGTERM, signal.SIGKILL):
            for pid in (left := [p for p in group_members(me) if p != me]):
                with suppress(ProcessLookupError):
                    os.kill(pid, signum)
            deadline = time.monotonic() + END_GRACE_S
            while left and time.monotonic() < deadline:
                time.sleep(POLL_S)
                left = [p for p in group_members(me) if p != me]

    def _launch(self, group: int, incarnation: int, logs: ExitStack) -> Ranks:
        part = self.plan.parts[group]
        ranks = part.nodes * part.tasks_per_node
        env = {**os.environ, **self.shared, components.COMPONENT_ENV: part.name,
               "MASTER_PORT": str(ports.free_local_port()), "CUDA_VISIBLE_DEVICES": self.gpus[group],
               "SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": self.job_id,
               "SUBMITIT_LOCAL_NTASKS": str(ranks), "SUBMITIT_LOCAL_NODEID": "0",
               "SUBMITIT_LOCAL_JOB_NUM_NODES": "1", DECIDES_ENV: "1" if part.primary else "0"}
        event(self.paths, self.job_id, "launch", part=part.name, part_attempt=0, incarnation=incarnation)
        procs = []
        for k in range(ranks):
            out, err = (self._log(logs, pattern, k) for pattern in (part.stdout, part.stderr))
            procs.append(subprocess.Popen(
                part.command, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                env={**env, "SUBMITIT_LOCAL_LOCALID": str(k), "SUBMITIT_LOCAL_GLOBALID": str(k)}))
        return Ranks(procs)

    def _log(self, logs: ExitStack, pattern: str, rank: int) -> int:
        """Rank `rank`'s log (the plan's Slurm pattern, its %j and %t filled), open for appending: a
        part's next incarnation goes on in the same file, as a requeued job's does."""
        path = Path(pattern.replace("%j", self.job_id).replace("%t", str(rank)))
        return logs.enter_context(open(path, "ab", buffering=0)).fileno()  # noqa: SIM115 - closed by `logs`


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -P -m slurmkit.supervisor.local_parts")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--plan", required=True, help="the plan as JSON (slurmkit.common.supervisor_plan.Plan)")
    parser.add_argument("--time-s", type=float, default=0.0, help="the run's time; 0: no limit")
    parser.add_argument("--signal-delay-s", type=float, default=0.0)
    args = parser.parse_args(argv)
    plan = Plan.model_validate_json(args.plan)
    return LocalParts(plan, RunPaths(Path(args.run_dir)), args.time_s, args.signal_delay_s).run()


if __name__ == "__main__":
    sys.exit(main())
