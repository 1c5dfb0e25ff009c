"""Requeue policy by cause, shared by rank 0 (preemption, timeout) and the batch shell (hang, crash).
A crash, a hang or a lost node (with spare nodes, or elastic) is first restarted inside the
allocation (a new srun step, or for an exception the processes survive a warm restart in them),
within the profile's requeue.in_job per incarnation; then it goes through the queue.

The cause is what is known for sure: the marker the requester wrote before asking Slurm to
requeue, or else what Slurm reports for the previous incarnation (sacct: NODE_FAIL, PREEMPTED,
TIMEOUT, REQUEUED). Each cause has its own budget in the profile's `requeue` block. An error
that repeats at the same step is deterministic and never requeued. Every restart is appended to
run.json with its cause.

Also the batch shell's entry point, after srun exits non-zero:
    python -m slurmkit.worker.requeue --run-dir DIR --exit-code RC
It exits 0 only when every rank had in fact finished (the job is then recorded as completed), and
75 when the batch shell is to start the ranks again in the job.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from slurmkit.common import outcomes, trust
from slurmkit.common.atomic import atomic_write_text
from slurmkit.common.outcomes import Outcome
from slurmkit.common.slurm_env import expand_hostlist, slurm_job_id
from slurmkit.runs import RunPaths, RunRecord
from slurmkit.worker import allocation
from slurmkit.worker.allocation import Allocation

SLURM_STATE_CAUSE = {"NODE_FAIL": "node_failure", "PREEMPTED": "preemption", "TIMEOUT": "timeout",
                     "REQUEUED": "requeue", "REQUEUE_HOLD": "requeue", "FAILED": "crash"}


def _now() -> str:
    return dt.datetime.now().isoformat(timespec="seconds")


TIMEOUT_MARGIN_S = 60  # Slurm checks limits about every 30 s, so the signal may come that early
IN_JOB_RETRY_S = 30.0  # after a crash or hang the job is not being stopped: a controller hiccup may take this long


def cause_of_signal(left_s: float | None, signal_delay_s: int) -> tuple[str, str]:
    """(cause, detail) of the profile's signal, from the seconds the job had left (squeue %L)."""
    if left_s is not None and left_s <= signal_delay_s + TIMEOUT_MARGIN_S:
        return "timeout", f"{left_s:.0f} s left of the time limit"
    return "preemption", "signal with time to spare" if left_s is None else f"signal with {left_s:.0f} s left"


def after_stop(paths: RunPaths, job_id: str, step: int | None, requeue_signal: bool) -> str:
    """Rank 0, once the ranks have stopped (and saved, at `step`): what the stop signal meant and
    what was done about it, in one line.

    - Slurm is preempting the job (its PreemptTime is set). That is SIGTERM alone, or the profile's
      signal first where the cluster sends the user signal on preemption. Under PreemptMode=REQUEUE
      the requeue is asked for now, inside GraceTime: a job that ends before its grace is over is
      recorded COMPLETED by Slurm and never comes back. Under CANCEL the run is marked preempted;
      `slurmkit resubmit` resumes it.
    - Else the profile's signal is the time limit coming, or a preemption by hand
      (`scancel --signal`): requeued for its cause, within budget.
    - Else SIGTERM is scancel, `scontrol requeue` or the limit itself: Slurm decides, nothing is asked.

    A requeue that Slurm refuses, or that its controller does not answer in time, is said in this
    one line too (the ranks have saved), not in a traceback.
    """
    from slurmkit.errors import SlurmError
    from slurmkit.slurm import commands

    at = f" at step {step}" if step is not None else ""
    try:
        return _act_on_stop(paths, job_id, at, step, requeue_signal)
    except commands.RequeueUncertain as exc:
        return f"stopped{at}, saved; the requeue may or may not have gone through: {exc.one_line()}"
    except SlurmError as exc:
        return f"stopped{at}, saved; the requeue failed, so the job ends here: {exc.one_line()}"


def _act_on_stop(paths: RunPaths, job_id: str, at: str, step: int | None, requeue_signal: bool) -> str:
    from slurmkit.errors import SlurmError
    from slurmkit.slurm import commands

    try:
        pre = commands.preemption(job_id)
    except SlurmError:
        pre = None
    if pre is not None:
        detail = f"preempted by a higher-priority job at {pre.at} (PreemptMode={pre.mode})"
        if not pre.requeues:
            mark_preempted(paths, job_id, step, detail)
            return (f"{detail}; stopped{at}. It does not come back by itself: "
                    f"resume it with `slurmkit resubmit {paths.run_id}`")
        ok = request(paths, job_id, "preemption", step, detail, within_s=pre.left_s)
        return f"{detail}; stopped{at}; {'requeued' if ok else 'preemption budget spent, not requeued'}"
    if not requeue_signal:
        return f"SIGTERM: stopped{at}; Slurm ends or requeues the job itself"
    try:
        left = commands.time_left_s(job_id)
    except SlurmError:  # a controller that does not answer in time: the signal reads as a preemption
        left = None
    delay = int((RunRecord(paths).read().get("profile") or {}).get("signal_delay_s", 0))
    cause, detail = cause_of_signal(left, delay)
    # Time left unknown (squeue did not answer): the controller may be back within a usual retry span.
    ok = request(paths, job_id, cause, step, detail, within_s=IN_JOB_RETRY_S if left is None else left)
    return f"stopped{at} ({cause}); {'requeued: the run starts again' if ok else 'requeue budget spent, not requeued'}"


def mark_preempted(paths: RunPaths, job_id: str, step: int | None, detail: str) -> None:
    """A preemption that Slurm ends for good (PreemptMode=CANCEL): the run's record says so, since
    the job itself, having exited in time, is COMPLETED in Slurm's eyes."""
    RunRecord(paths).update(preempted={"job_id": job_id, "step": step, "detail": detail, "time": _now()})


def _budgets(record: dict[str, Any]) -> dict[str, Any]:
    """The profile's `requeue` block as run.json recorded it at submit."""
    return (record.get("profile") or {}).get("requeue") or {}


def budget(record: dict[str, Any], cause: str) -> int:
    budgets = _budgets(record)
    # An external `scontrol requeue` (or a restart nobody recorded a reason for) spends the
    # preemption budget: from inside the job it looks the same.
    return int(budgets.get("preemption" if cause in ("requeue", "unknown") else cause, 0))


def spent(record: dict[str, Any], cause: str) -> int:
    return sum(1 for r in record.get("restarts", []) if r.get("cause") == cause)


def allowed(record: dict[str, Any], cause: str) -> bool:
    return not record.get("final") and spent(record, cause) < budget(record, cause)


def request(paths: RunPaths, job_id: str, cause: str, step: int | None = None, detail: str = "",
            bad_nodes: list[str] | None = None, within_s: float = IN_JOB_RETRY_S) -> bool:
    """Ask Slurm to requeue this job for `cause`, if its budget allows; the marker goes first. A
    controller hiccup is retried for `within_s`, the time the job has left (a grace, a limit).

    bad_nodes (a failed health gate) join the run's excluded nodes; every requeue asks Slurm to
    keep the job off all of them, as long as the partition still has enough other nodes.
    """
    from slurmkit.slurm import commands

    with RunRecord(paths).editing() as record:
        ok = allowed(record, cause)
        if not ok:
            record["final"] = f"{cause} budget of {budget(record, cause)} spent"
        snapshot = dict(record)
    if not ok:
        return False
    excluded = sorted({*snapshot.get("excluded_nodes", []), *(bad_nodes or [])})
    atomic_write_text(paths.restart_request, json.dumps(
        {"cause": cause, "step": step, "detail": detail, "job_id": job_id, "restart_count": outcomes.restart_count(),
         "time": _now()}) + "\n")
    # Requeueing from inside the job makes Slurm signal this very process; finish both calls first.
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        commands.requeue(job_id, within_s=max(1.0, within_s - 2))
        note = _exclude(job_id, excluded, snapshot)
    except commands.RequeueUncertain:
        raise  # it may yet go through: the next start must find the cause (a stale marker is never read)
    except BaseException:
        # No requeue happened: the marker would make the batch shell think one had been asked for.
        paths.restart_request.unlink(missing_ok=True)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    if excluded:
        RunRecord(paths).update(excluded_nodes=excluded, exclusion=note)
    return True


def _exclude(job_id: str, nodes: list[str], record: dict[str, Any]) -> str:
    """Keep the requeued job off `nodes`, if the partition has enough others; says what was done.

    Safe without a race: the requeued job stays COMPLETING (so cannot start) until this process,
    part of its batch step, has exited.
    """
    from slurmkit.errors import SlurmError
    from slurmkit.slurm import commands

    if not nodes:
        return ""
    profile_exclude = expand_hostlist((record.get("profile") or {}).get("exclude") or "")
    partition = os.environ.get("SLURM_JOB_PARTITION", "")
    needed = int(os.environ.get("SLURM_JOB_NUM_NODES", "1"))
    try:
        total = int(commands.show_partitions().get(partition, {}).get("TotalNodes", "0") or 0)
        spare = total - len({*nodes, *profile_exclude})
        if spare < needed:
            return (f"not excluded {','.join(nodes)}: partition {partition} would have {spare} node(s) left for a "
                    f"{needed}-node job")
        commands.exclude_nodes(job_id, [*nodes, *profile_exclude])
    except SlurmError as exc:
        return f"not excluded {','.join(nodes)}: {exc.one_line()}"
    return f"excluded {','.join(nodes)}"


def _marker(paths: RunPaths, job_id: str, restart_count: int) -> dict[str, Any] | None:
    """The restart request incarnation `restart_count` of the job left before asking Slurm
    (request), if it is readable; one from another incarnation or job is stale."""
    try:
        marker = json.loads(paths.restart_request.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if not isinstance(marker, dict) or "cause" not in marker:
        return None
    return marker if (marker.get("job_id"), marker.get("restart_count")) == (job_id, restart_count) else None


def _restart_cause(paths: RunPaths, job_id: str, restart_count: int) -> tuple[str, str]:
    """The marker the previous incarnation's requester left, else what accounting says that
    incarnation ended as."""
    marker = _marker(paths, job_id, restart_count - 1)
    if marker is not None:
        return str(marker["cause"]), str(marker.get("detail", ""))
    from slurmkit.slurm import commands

    return cause_of_previous(commands.incarnation_states(job_id))


def cause_of_previous(states: list[str]) -> tuple[str, str]:
    """(cause, detail) of a restart from accounting: how the incarnation before the current one ended."""
    previous = states[-2] if len(states) >= 2 else ""
    detail = f"slurm state {previous}" if previous else "no marker and no accounting record"
    return SLURM_STATE_CAUSE.get(previous, "unknown"), detail


def _recorded(record: dict[str, Any], job_id: str, restart_count: int, attempt: int = 0) -> dict[str, Any] | None:
    """The restart entry that started incarnation `restart_count`'s srun step `attempt` (0: the
    incarnation itself, by a requeue or a resubmit; 1..: an in-job restart)."""
    done = [r for r in record.get("restarts", []) if r.get("job_id") == job_id and r.get("n") == restart_count
            and r.get("in_job", 0) == attempt and not r.get("warm")]
    return done[0] if done else None


def record_restart(paths: RunPaths, job_id: str, restart_count: int, resumed_step: int | None) -> dict[str, Any]:
    """On start of incarnation N > 0: append the restart and its cause to run.json (once), under its lock."""
    done = _recorded(RunRecord(paths).read(), job_id, restart_count)
    if done:
        return done
    cause, detail = _restart_cause(paths, job_id, restart_count)  # before the lock: it may ask sacct
    lost = lost_steps(paths, resumed_step)
    with RunRecord(paths).editing() as record:
        entry = _recorded(record, job_id, restart_count)
        if entry is None:
            entry = {"n": restart_count, "job_id": job_id, "cause": cause, "detail": detail, "time": _now(),
                     "resumed_step": resumed_step, "lost_steps": lost}
            record.setdefault("restarts", []).append(entry)
            if spent(record, cause) > budget(record, cause):
                record["final"] = f"{cause} budget of {budget(record, cause)} spent"
    paths.restart_request.unlink(missing_ok=True)
    paths.stop_marker.unlink(missing_ok=True)
    return entry


def lost_steps(paths: RunPaths, resumed_step: int | None) -> int | None:
    """Steps the last incarnation ran past the checkpoint this one resumes from: they run again.
    0 when the stop's save made it (within GraceTime or KillWait); None before any step ran."""
    reached = [s for s in (_last_step(paths), _stop_step(paths)) if s is not None]
    return max(0, max(reached) - (resumed_step or 0)) if reached else None


def _stop_step(paths: RunPaths) -> int | None:
    """The stop step of the last incarnation (its marker): its metrics record may never have been written."""
    try:
        return int(json.loads(paths.stop_marker.read_text())["step"])
    except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def note_resumed(paths: RunPaths, job_id: str, restart_count: int, attempt: int,
                 resumed_step: int | None) -> dict[str, Any] | None:
    """Rank 0 of a start that the login node or the batch shell recorded before it ran (a resubmitted
    job's restart 0; an in-job restart): its entry learns the step it resumed from and the steps
    that run again. The entry, or None if there is none."""
    entry = _recorded(RunRecord(paths).read(), job_id, restart_count, attempt)
    if entry is None or entry.get("resumed_step") is not None:
        return entry
    lost = lost_steps(paths, resumed_step)
    with RunRecord(paths).editing() as record:
        entry = _recorded(record, job_id, restart_count, attempt)
        if entry is not None:
            entry.update(resumed_step=resumed_step, lost_steps=lost)
    paths.stop_marker.unlink(missing_ok=True)
    return entry


def _last_step(paths: RunPaths) -> int | None:
    from slurmkit.common.metrics import last_record

    record = last_record(paths.metrics)
    return int(record["step"]) if record and "step" in record else None


def _outcomes(paths: RunPaths, job_id: str, num_tasks: int) -> list[Outcome | None]:
    """This incarnation's outcome records (never submitit's pickles); older incarnations' count as none."""
    count, attempt = outcomes.restart_count(), outcomes.attempt()
    found = [paths.outcome(job_id, rank) for rank in range(num_tasks)]
    return [o if o is not None and (o.restart_count, o.attempt) == (count, attempt) else None for o in found]


def _error_signature(found: list[Outcome | None]) -> str | None:
    """The error line of the first rank that raised by itself (not because a peer was lost), if any."""
    return next((o.error_line for o in found if o is not None and not o.ok and not o.peer_failed), None)


COMPLETED = "completed"
IN_JOB = "restarting in the job"
IN_JOB_EXIT = 75  # main's exit status that tells the batch shell to start the ranks again (EX_TEMPFAIL)


def restart_in_job(paths: RunPaths, job_id: str, cause: str, step: int | None, detail: str,
                   alloc: Allocation | None, lost: list[str] | None = None) -> str | None:
    """The batch shell, after a crash, hang or lost node: record an in-job restart if this
    incarnation has one left (the profile's requeue.in_job), the cause's budget allows it and the
    allocation still has the nodes a step needs (a spare in place of a lost one, or elastic: the
    nodes left, recorded as `nodes`); what was decided,
    or None to go through the queue instead. The entry names the held nodes the next step leaves
    out (`exclude`) and the nodes lost (`nodes_lost`).

    A new srun step in the same allocation, not an in-process restart: a rank that died or hung
    is gone with its step either way, and the fresh step starts every rank the way a requeue would
    (imports, rendezvous, the newest valid checkpoint), minus the queue.
    """
    attempt = outcomes.attempt()
    if alloc is None or not alloc.fits:
        return None  # an allocation Slurm cannot describe is left to the requeue
    with RunRecord(paths).editing() as record:
        if not (_in_job_left(record, job_id) and allowed(record, cause)):
            return None
        record.setdefault("restarts", []).append(
            {"n": outcomes.restart_count(), "in_job": attempt + 1, "job_id": job_id, "cause": cause,
             "detail": detail, "time": _now(), "step": step, "resumed_step": None, "lost_steps": None,
             "exclude": list(alloc.unusable), "nodes_lost": lost or [], "nodes": alloc.step_nodes})
        left = budget(record, cause) - spent(record, cause)
    return f"{IN_JOB} (attempt {attempt + 1}): {cause} ({detail}); {left} {cause} restart(s) left"


def _in_job_entries(record: dict[str, Any], job_id: str) -> list[dict[str, Any]]:
    """This incarnation's in-job restarts, warm and cold."""
    return [r for r in record.get("restarts", [])
            if r.get("job_id") == job_id and r.get("n") == outcomes.restart_count() and r.get("in_job")]


def _in_job_left(record: dict[str, Any], job_id: str) -> bool:
    """The profile's requeue.in_job is per incarnation, warm and cold restarts together."""
    return len(_in_job_entries(record, job_id)) < int(_budgets(record).get("in_job", 0))


def _repeated(record: dict[str, Any], signature: str | None, step: int | None) -> bool:
    """The same error at the same step seen before: deterministic, so the run ends (record["final"]);
    else the failure is noted for next time."""
    failures = record.setdefault("failures", [])
    if signature and any(f.get("error") == signature and f.get("step") == step for f in failures):
        record["final"] = f"deterministic error at step {step}: {signature}"
        return True
    failures.append({"error": signature, "step": step, "time": _now()})
    return False


def restart_warm(paths: RunPaths, job_id: str, step: int, signature: str | None, detail: str,
                 resumed_step: int | None, live: bool = False) -> str | None:
    """Rank 0, after an exception that every rank's process survived: record a warm in-job restart
    (in the process, from memory, `live` where from the live state; slurmkit.worker.warm) if the
    deterministic-error rule, the in-job limit and the crash budget allow; what was decided, or
    None. On None the ranks re-raise and the batch shell decides (after_failure), so a failure is
    noted only where it restarts here or ends the run."""
    with RunRecord(paths).editing() as record:
        if not (_in_job_left(record, job_id) and allowed(record, "crash")):
            return None
        if _repeated(record, signature, step):
            return None
        n_in_job = len(_in_job_entries(record, job_id)) + 1
        record.setdefault("restarts", []).append(
            {"n": outcomes.restart_count(), "in_job": n_in_job, "warm": True, "job_id": job_id, "cause": "crash",
             "detail": detail, "time": _now(), "step": step, "resumed_step": resumed_step,
             "lost_steps": step - (resumed_step or 0), **({"live": True} if live else {})})
        left = budget(record, "crash") - spent(record, "crash")
    return f"{IN_JOB}, warm (in-job restart {n_in_job}): crash ({detail}) at step {step}; {left} crash restart(s) left"


def _newly_lost(paths: RunPaths, job_id: str, alloc: Allocation | None) -> list[str]:
    """Nodes this incarnation lost since its last in-job restart (none where Slurm cannot say)."""
    if alloc is None:
        return []
    known = {n for r in _in_job_entries(RunRecord(paths).read(), job_id) for n in r.get("nodes_lost", [])}
    return [n for n in alloc.lost if n not in known]


def _allocation(job_id: str) -> Allocation | None:
    from slurmkit.errors import SlurmError

    try:
        return allocation.read(job_id)
    except SlurmError:
        return None


def next_step(paths: RunPaths, job_id: str) -> tuple[int | None, list[str]]:
    """The nodes the next step of the ranks runs on (None: as many as before) and the held nodes it
    leaves out: its in-job restart entry's (a warm one starts no step)."""
    entries = [e for e in _in_job_entries(RunRecord(paths).read(), job_id) if not e.get("warm")]
    return (entries[-1].get("nodes"), list(entries[-1].get("exclude", []))) if entries else (None, [])


def _requested_here(paths: RunPaths, job_id: str) -> str | None:
    """The cause of the requeue this incarnation already asked for (rank 0, after a stop), if any."""
    marker = _marker(paths, job_id, outcomes.restart_count())
    return None if marker is None else str(marker["cause"])


def after_failure(paths: RunPaths, job_id: str, exit_code: int) -> str:
    """Decide, after srun failed, whether to requeue; returns what was decided. A requeue that rank 0
    has already asked for stands: its marker (and cause) is never replaced by a crash."""
    asked = _requested_here(paths, job_id)
    if asked is not None:
        return f"srun exit code {exit_code} after rank 0 asked for a requeue ({asked}): nothing more to do"
    num_tasks = int(RunRecord(paths).read().get("num_tasks", 1))
    found = _outcomes(paths, job_id, num_tasks)
    if all(o is not None and o.ok for o in found):
        # Every rank of this incarnation recorded success: it failed while exiting, after its work was done.
        return COMPLETED
    hangs = paths.hang_markers()
    step = _last_step(paths)
    alloc = _allocation(job_id)
    lost = _newly_lost(paths, job_id, alloc)
    if hangs:
        cause, detail = "hang", hangs[0].read_text().strip()
        for h in hangs:
            h.unlink()
    elif lost:
        cause, detail = "node_failure", f"lost {','.join(lost)} (the job no longer holds it)"
    else:
        signature = _error_signature(found)
        cause, detail = "crash", signature or f"srun exit code {exit_code}"
        with RunRecord(paths).editing() as record:
            repeated = _repeated(record, signature, step)
        if repeated:
            return f"not requeued: the same error at step {step} twice ({signature})"
    in_job = restart_in_job(paths, job_id, cause, step, detail, alloc, lost)
    if in_job is not None:
        return in_job
    if request(paths, job_id, cause, step, detail, bad_nodes=lost):
        return f"requeued: {cause} ({detail})"
    return f"not requeued: {cause} budget spent"


def after_health_gate(paths: RunPaths, job_id: str) -> str:
    """Some node failed the health gate: requeue (cause node_failure) with those nodes excluded."""
    markers = paths.health_markers()
    found = [json.loads(m.read_text()) for m in markers]
    for m in markers:
        m.unlink()
    nodes = [f["node"] for f in found]
    detail = "; ".join(f"{f['node']}: {', '.join(f['problems'])}" for f in found) or "health gate failed"
    with RunRecord(paths).editing() as record:
        record["unhealthy"] = [*record.get("unhealthy", []), *({**f, "time": _now()} for f in found)]
    if request(paths, job_id, "node_failure", _last_step(paths), f"health gate: {detail}", bad_nodes=nodes):
        return f"requeued: node_failure ({detail}); {RunRecord(paths).read().get('exclusion', '')}"
    return f"not requeued: node_failure budget spent ({detail})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurmkit.worker.requeue")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--exit-code", type=int, default=1)
    parser.add_argument("--health", action="store_true", help="the node health gate failed")
    parser.add_argument("--standby", action="store_true", help="standby ranks wait: an in-job restart goes to them")
    args = parser.parse_args(argv)
    job_id = slurm_job_id()
    if not job_id:
        print("slurmkit requeue: not inside a Slurm job", file=sys.stderr)
        return 2
    paths = RunPaths(Path(args.run_dir))
    from slurmkit.errors import SlurmError

    try:
        if args.health:
            print(f"slurmkit: {after_health_gate(paths, job_id)}", file=sys.stderr, flush=True)
            return 1
        decision = after_failure(paths, job_id, args.exit_code)
    except SlurmError as exc:  # the job ends here; its log says why it did not come back
        print(f"slurmkit: ranks failed (exit {args.exit_code}); requeue failed: {exc.one_line()}",
              file=sys.stderr, flush=True)
        return 1
    if decision.startswith(IN_JOB):
        print(f"slurmkit: ranks failed (exit {args.exit_code}); {decision}", file=sys.stderr, flush=True)
        if args.standby:  # the standby ranks take the next attempt (slurmkit.worker.standby)
            trust.touch(paths.standby_go(job_id, outcomes.restart_count(), outcomes.attempt() + 1))
        nodes, exclude = next_step(paths, job_id)
        # The batch shell's srun --nodes and --exclude (spare nodes, elastic).
        print(nodes or os.environ.get(allocation.STEP_NODES_ENV, ""), ",".join(exclude))
        return IN_JOB_EXIT
    if decision == COMPLETED:
        print(f"slurmkit: srun exit {args.exit_code}, but every rank had finished its work; the run is complete",
              file=sys.stderr, flush=True)
        return 0
    print(f"slurmkit: ranks failed (exit {args.exit_code}); {decision}", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
