"""Warm restart: after an exception that every rank's process survives, training restarts inside
the processes, with their imports, model code and data kept. Only the process group is rebuilt,
and the state comes back from memory: where every rank failed before the same step's update, from
the live state itself (only the step's start is put back: step count, data position, RNG; no
step is lost), else from each rank's host copy of the last committed step (TrainerFT, host_copy).

The protocol runs over the store the group was built on (slurmkit.worker.process_group.Group), which
outlives it. For generation g:
1. A rank that raised aborts its group (Group.abort: its sockets to the peers are shut). A peer
   blocked in a gloo collective with it fails at once ("Connection closed by peer", measured:
   1 ms), raises in turn and does the same, so the failure reaches every rank however their
   collectives are chained.
2. Each rank reports its error line under warm/g/rank<r> in the store.
3. Rank 0 waits for every report (at most `report_wait_s`), decides with the requeue policy
   (a RankRaised event for supervisor.policy.decide: the deterministic-error rule, requeue.in_job,
   requeue.crash) and writes
   warm/g/decision, with the live step when every report names the same one (`live_step`).
4. On a restart every rank builds generation g+1 on the same store, wraps the model in a new DDP
   and restores from the live state or from its host copy, as decided. Otherwise every rank
   re-raises its error: the srun step fails and the supervisor restarts in the job with new
   processes (cold) or requeues.

A rank whose process died never reports: srun's --kill-on-bad-exit ends the step meanwhile (the
cold path), and its SIGTERM ends the others' wait. NCCL is left to the cold path too: its
collectives do not fail when a peer closes its communicator, they wait for the timeout, and
aborting them needs a monitor thread per rank.
Single-rank runs have no group of their own: a new srun step restarts them.
"""

from __future__ import annotations

import dataclasses
import json
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from slurmkit.common import outcomes
from slurmkit.jsontypes import JsonObject
from slurmkit.supervisor.decision import Decision
from slurmkit.worker.process_group import Dist
from slurmkit.worker.signed_store import SignedStore
from slurmkit.worker.train.trainer import Trainer

POLL_S = 0.02
REPORT_FLOOR_S = 10.0
DECISION_S = 30.0  # rank 0's policy call: a run.json lock on a shared filesystem


@dataclass(frozen=True)
class Report:
    """One rank's side of a failure."""

    rank: int
    error: str
    """The error's last exception line (outcomes.Outcome.error_line: what the supervisor's policy would read)."""
    peer_failed: bool
    """A collective lost its peer: a consequence of another rank's failure."""
    live_step: int | None = None
    """This rank's live state is the start of this step (TrainerFT.live_step), else None."""


@dataclass(frozen=True)
class Verdict:
    restart: bool
    live_step: int | None = None
    """Restart from the live state at this step's start; None: from the host copy."""


def report_of(rank: int, error: BaseException, live_step: int | None = None) -> Report:
    outcome = outcomes.Outcome(state=outcomes.ERROR, error="".join(traceback.format_exception(error)))
    return Report(rank, outcome.error_line, outcome.peer_failed, live_step)


def live_step(reports: list[Report]) -> int | None:
    """The step every rank's live state starts, if they all name the same one: the ranks can go on
    from where they are. A rank past its update (a hook failed) or inside it makes it None."""
    steps = {r.live_step for r in reports}
    return steps.pop() if len(steps) == 1 else None


def cause_of(reports: list[Report]) -> tuple[str | None, str]:
    """(signature, detail): the first rank that raised by itself, as the supervisor reads outcomes."""
    own = next((r for r in reports if not r.peer_failed), None)
    if own is None:
        return None, f"a collective lost its peer on rank(s) {','.join(str(r.rank) for r in reports)}"
    return own.error, f"rank {own.rank}: {own.error}"


Decide = Callable[[list[Report], int | None], Decision | None]
"""Rank 0's policy on every rank's report and their common live step: the Decision that a warm
restart happens (supervisor.policy.decide on a RankRaised event), or None."""


def _poll(check: Callable[[], bool], timeout_s: float, beat: Callable[[], None], ending: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if ending() or time.monotonic() > deadline:
            return False
        beat()  # waiting on peers here is not a hang
        time.sleep(POLL_S)
    return True


def agree(dist: Dist, mine: Report, decide: Decide, report_wait_s: float, beat: Callable[[], None],
          ending: Callable[[], bool]) -> Verdict:
    """Steps 1-3 on this rank: whether every rank is to restart in the process, and from what.

    `ending`: Slurm is ending this step (SIGTERM: srun's --kill-on-bad-exit after a rank died, or
    scancel). The wait stops there, for the cold path: waiting on would only hold the step up
    until SIGKILL, KillWait later (30 s by default)."""
    group = dist.group
    assert group is not None
    group.abort()
    prefix = f"slurmkit/warm/{group.generation}/"
    store = group.store
    store.set(f"{prefix}rank{dist.rank}", json.dumps(dataclasses.asdict(mine)))
    keys = [f"{prefix}rank{r}" for r in range(dist.world_size)]
    if dist.is_main:
        decision = Verdict(False)
        # Only values signed with the run's secret count, and only well-formed ones (parse_report).
        got: dict[str, Report] = {}
        if _poll(lambda: _collect(store, keys, parse_report, got), report_wait_s, beat, ending):
            reports = [got[k] for k in keys]
            live = live_step(reports)
            decided = decide(reports, live)
            if decided is not None:
                decision = Verdict(True, live)
                print(f"slurmkit: {decided.message}", flush=True)
        else:
            missing = [str(r) for r, k in enumerate(keys) if k not in got]
            why = (f"SIGTERM, Slurm is ending the step (rank(s) {','.join(missing)} had not reported)" if ending()
                   else f"rank(s) {','.join(missing)} did not report within {report_wait_s:.0f} s")
            print(f"slurmkit: no warm restart: {why}", flush=True)
        store.set(f"{prefix}decision", json.dumps(dataclasses.asdict(decision)))
        return decision
    key = f"{prefix}decision"
    verdicts: dict[str, Verdict] = {}
    try:
        if not _poll(lambda: _collect(store, [key], parse_verdict, verdicts), report_wait_s + DECISION_S, beat, ending):
            return Verdict(False)
        return verdicts[key]
    except Exception:  # noqa: BLE001 - rank 0's store is gone (its process died): the cold path
        return Verdict(False)


MAX_VALUE_BYTES = 64 << 10
T = TypeVar("T")


def _collect(store: SignedStore, keys: list[str], parse: Callable[[Any], T], found: dict[str, T]) -> bool:
    """Read the keys not yet in `found` into it (_read); True once every key is there. A value, once
    read, is kept: only the keys still missing are asked for at each poll."""
    for key in keys:
        if key not in found and (value := _read(store, key, parse)) is not None:
            found[key] = value
    return len(found) == len(keys)


def _read(store: SignedStore, key: str, parse: Callable[[Any], T]) -> T | None:
    """The value at `key` when it is there, signed with the run's secret (SignedStore) and well
    formed; else None, as if absent: another user's value never decides anything, nor crashes."""
    try:
        raw = store.peek(key)
        if raw is None or len(raw) > MAX_VALUE_BYTES:
            return None
        return parse(json.loads(raw))
    except (ValueError, TypeError, KeyError):
        return None


def parse_report(data: object) -> Report:
    """A Report from its JSON, every field of its type; ValueError otherwise."""
    if not (isinstance(data, dict) and type(data.get("rank")) is int and isinstance(data.get("error"), str)
            and isinstance(data.get("peer_failed"), bool) and _step(data.get("live_step"))):
        raise ValueError("not a report")
    return Report(data["rank"], data["error"], data["peer_failed"], data.get("live_step"))


def parse_verdict(data: object) -> Verdict:
    if not (isinstance(data, dict) and isinstance(data.get("restart"), bool) and _step(data.get("live_step"))):
        raise ValueError("not a decision")
    return Verdict(data["restart"], data.get("live_step"))


def _step(value: object) -> bool:
    return value is None or (type(value) is int and value >= 0)


def rebuild(trainer: Trainer) -> None:
    """Step 4's group and DDP: the next generation over the same store."""
    group = trainer.dist.group
    assert group is not None
    group.rebuild()
    trainer.wrap()


def report_wait_s(median_step_s: float) -> float:
    """How long rank 0 waits for the others' reports: a peer busy computing reaches its next
    collective within a step or so."""
    return max(REPORT_FLOOR_S, 3 * median_step_s)


def possible(dist: Dist) -> bool:
    """A group of this process's own on gloo: the protocol can run (see the module's docstring)."""
    return dist.group is not None and dist.backend == "gloo"


def first_step_hook(failed_at: float, restored: object) -> Callable[[Trainer, JsonObject], None]:
    """The first step back carries what the warm restart took (the report and benchmarks read it)."""
    def hook(trainer: Trainer, record: JsonObject) -> None:
        record["warm_restart"] = {"failed_at": round(failed_at, 3), "resumed_step": restored,
                                  "back_s": round(time.time() - failed_at, 3)}
        trainer.hooks.remove(hook)

    return hook
