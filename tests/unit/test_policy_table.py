"""The restart policy as a table: `decide(state, event)` is pure, so each case is a record, an event
and the Decision's typed fields; no run folder, no Slurm. The effects' side (run.json, the marker,
scontrol) is supervisor.effects's (tests/unit/test_requeue_policy.py, test_polling, the cluster tests)."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

import pytest

from slurmkit.common.cause import Cause
from slurmkit.common.markers import HangMarker, HealthReport, PruneRequest, Straggler
from slurmkit.common.outcomes import Outcome
from slurmkit.common.record import RestartEntry, RunRecord
from slurmkit.supervisor import policy
from slurmkit.supervisor.allocation import Allocation
from slurmkit.supervisor.decision import Action
from slurmkit.supervisor.policy import (
    HealthFailed,
    Preempting,
    RankRaised,
    State,
    StepFailed,
    StepStopped,
    StragglerLasted,
)
from tests.conftest import ROOT

BAD = "Traceback (most recent call last):\nValueError: bad batch"
PEER = ("Traceback (most recent call last):\n  File \"trainer.py\", line 228, in train_step\n"
        "RuntimeError: Got the following error when running the callback: RuntimeError: [gloo/transport/tcp/"
        "pair.cc:537] Read error [10.77.0.12]:45748: Connection reset by peer.\n\nAt:\n"
        "  torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py(31): <lambda>\n")
WHOLE = Allocation(("node1", "node2"), ("node1", "node2"), (), 2)
# node2 left the job; node3, the spare, is held and healthy; node4 is held but drained.
SPARE = Allocation(("node1", "node2", "node3", "node4"), ("node1", "node3", "node4"), ("node4",), 2)
ELASTIC = Allocation(("node1", "node2"), ("node1",), (), 2, least=1)
SHRUNK = Allocation(("node1", "node2"), ("node1",), (), 2)  # not elastic: a step needs both
ROOM = Allocation(("node1", "node2", "node3"), ("node1", "node2", "node3"), (), 2)  # node3: a spare, unused
SLOW = StragglerLasted(Straggler(1, "node2", 0.31, 0.0), 300.0)
PRUNED = PruneRequest(20, 3.5, "t")  # a search's pruner stopped the trial at its value of step 20
ROOMY = {"preemption": 9, "timeout": 9, "crash": 9, "hang": 9, "node_failure": 9, "in_job": 9}
LOOP = [{"kind": kind, "n": n, "job_id": "7", "time": "t", "cause": "crash", "resumed_step": 20, "in_job": in_job}
        for kind, n, in_job in (("requeue", 1, None), ("in_job", 1, 1), ("requeue", 2, None))]


def ok() -> Outcome:
    return Outcome(state="success", returncode=0)


def err(text: str) -> Outcome:
    return Outcome(state="error", error=text)


def entry(**fields: Any) -> RestartEntry:
    return RestartEntry.model_validate({"kind": "requeue", "n": 0, "job_id": "7", "time": "t", **fields})


@dataclass
class Case:
    name: str
    event: policy.Event
    expect: dict[str, Any]
    budgets: dict[str, int] = field(default_factory=lambda: {"preemption": 2, "timeout": 1, "crash": 2, "hang": 1,
                                                             "node_failure": 2, "in_job": 1})
    record: dict[str, Any] = field(default_factory=dict)
    alloc: Allocation | None = None
    pruned: PruneRequest | None = None
    last_step: int | None = 30
    attempt: int = 0
    signal_delay_s: int = 120

    def state(self) -> State:
        record = RunRecord.model_validate({"run_id": "run", "num_tasks": 2, "profile": {
            "requeue": self.budgets, "signal_delay_s": self.signal_delay_s}, **self.record})
        return State(record, "7", 0, self.attempt, self.last_step, "now", self.alloc, self.pruned)


CASES = [
    Case("every rank succeeded: the step failed while exiting", StepFailed(134, (ok(), ok())),
         {"action": Action.COMPLETE, "cause": None, "failure": None}),
    Case("a crash with a spare-free whole allocation restarts in the job", StepFailed(1, (err(BAD), err(PEER))),
         {"action": Action.RESTART_IN_JOB, "cause": Cause.CRASH, "step": 30, "nodes": 2}, alloc=WHOLE),
    Case("the same error at the same step twice is final", StepFailed(1, (err(BAD), None)),
         {"action": Action.END, "why": "deterministic", "step": 30, "entry": None},
         record={"failures": [{"error": "ValueError: bad batch", "step": 30}]}, alloc=WHOLE),
    Case("the same error at another step is not", StepFailed(1, (err(BAD), None)),
         {"action": Action.RESTART_IN_JOB, "cause": Cause.CRASH},
         record={"failures": [{"error": "ValueError: bad batch", "step": 20}]}, alloc=WHOLE),
    Case("a rank that lost its peer is no deterministic error", StepFailed(1, (err(PEER), err(PEER))),
         {"action": Action.RESTART_IN_JOB, "cause": Cause.CRASH},
         record={"failures": [{"error": None, "step": 30}]}, alloc=WHOLE),
    Case("in_job spent: the crash goes through the queue", StepFailed(1, (err(BAD), None)),
         {"action": Action.REQUEUE, "cause": Cause.CRASH, "detail": "ValueError: bad batch"},
         record={"restarts": [entry(kind="warm", in_job=1, cause="crash")]}, alloc=WHOLE),
    Case("in_job 0: no restart in the job", StepFailed(1, (err(BAD), None)),
         {"action": Action.REQUEUE, "cause": Cause.CRASH, "entry": None},
         budgets={"crash": 3, "in_job": 0}, alloc=WHOLE),
    Case("an allocation Slurm cannot describe is left to the requeue", StepFailed(1, (err(BAD), None)),
         {"action": Action.REQUEUE, "cause": Cause.CRASH}),
    Case("crash budget spent: the run ends", StepFailed(1, (err(BAD), None)),
         {"action": Action.END, "why": "budget", "final": "crash budget of 2 spent"},
         record={"restarts": [entry(n=1, cause="crash"), entry(n=2, cause="crash")]}, alloc=WHOLE),
    Case("a hang marker makes it a hang", StepFailed(1, (None, None), (HangMarker(1, 60.0, 0.0),)),
         {"action": Action.RESTART_IN_JOB, "cause": Cause.HANG, "failure": None}, alloc=WHOLE),
    Case("a startup timeout's marker is a startup hang, restarted as a hang",
         StepFailed(1, (None, None), (HangMarker(0, 600.0, 0.0), HangMarker(1, 600.0, 0.0, startup=True))),
         {"action": Action.RESTART_IN_JOB, "cause": Cause.STARTUP_HANG, "failure": None}, alloc=WHOLE),
    Case("it spends the hang budget", StepFailed(1, (None, None), (HangMarker(1, 600.0, 0.0, startup=True),)),
         {"action": Action.END, "why": "budget", "cause": Cause.STARTUP_HANG},
         record={"restarts": [entry(n=1, cause="hang")]}),
    Case("a lost node with a spare left restarts on the spare", StepFailed(1, (err(PEER), None)),
         {"action": Action.RESTART_IN_JOB, "cause": Cause.NODE_FAILURE, "nodes": 2, "exclude": ("node4",)},
         alloc=SPARE),
    Case("a lost node already restarted for is not lost twice", StepFailed(1, (err(BAD), None)),
         {"action": Action.RESTART_IN_JOB, "cause": Cause.CRASH},
         record={"restarts": [entry(kind="in_job", in_job=1, cause="node_failure", nodes_lost=["node2"])]},
         budgets={"crash": 2, "in_job": 2}, alloc=SPARE, attempt=1),
    Case("an elastic job goes on with the nodes left", StepFailed(1, (err(PEER), None)),
         {"action": Action.RESTART_IN_JOB, "cause": Cause.NODE_FAILURE, "nodes": 1, "exclude": ()}, alloc=ELASTIC),
    Case("a job that cannot shrink goes through the queue, avoiding the lost node", StepFailed(1, (err(PEER), None)),
         {"action": Action.REQUEUE, "cause": Cause.NODE_FAILURE, "exclude": ("node2",)}, alloc=SHRUNK),
    Case("the profile's signal with time to spare is a preemption", StepStopped(40, True, None, 3600.0),
         {"action": Action.REQUEUE, "cause": Cause.PREEMPTION, "step": 40, "within_s": 3600.0}),
    Case("the profile's signal near the limit is a timeout", StepStopped(40, True, None, 150.0),
         {"action": Action.REQUEUE, "cause": Cause.TIMEOUT, "within_s": 150.0}),
    Case("time left unknown reads as a preemption, retried a usual span", StepStopped(None, True, None, None),
         {"action": Action.REQUEUE, "cause": Cause.PREEMPTION, "step": None, "within_s": policy.IN_JOB_RETRY_S}),
    Case("timeout budget spent: the run ends", StepStopped(40, True, None, 100.0),
         {"action": Action.END, "why": "budget", "cause": Cause.TIMEOUT},
         record={"restarts": [entry(n=1, cause="timeout")]}),
    Case("SIGTERM without a preemption: Slurm decides", StepStopped(40, False, None, None),
         {"action": Action.END, "why": "slurm_decides", "cause": None, "final": None}),
    Case("SIGTERM of a preemption under REQUEUE: asked within the grace",
         StepStopped(40, False, Preempting("12:00", "REQUEUE", 18.0), None),
         {"action": Action.REQUEUE, "cause": Cause.PREEMPTION, "within_s": 18.0}),
    Case("a preemption under CANCEL: marked preempted, not requeued",
         StepStopped(40, True, Preempting("12:00", "CANCEL", 18.0), None),
         {"action": Action.END, "why": "cancel_mode", "cause": Cause.PREEMPTION}),
    Case("an external requeue spent the preemption budget", StepStopped(40, True, None, 3600.0),
         {"action": Action.END, "why": "budget", "cause": Cause.PREEMPTION},
         budgets={"preemption": 1}, record={"restarts": [entry(n=1, cause="requeue")]}),
    Case("a failed health gate requeues without the node",
         HealthFailed((HealthReport("node2", ["gpu 3 missing"], "nvidia-smi", []),)),
         {"action": Action.REQUEUE, "cause": Cause.NODE_FAILURE, "exclude": ("node2",), "step": 30}),
    Case("a warm restart spends in_job and crash", RankRaised(75, "ValueError: once", "rank 1", 50, False),
         {"action": Action.RESTART_WARM, "cause": Cause.CRASH, "step": 75}),
    Case("no warm restart once in_job is spent", RankRaised(75, "ValueError: x", "rank 1", 50, False),
         {"action": Action.ESCALATE, "entry": None, "failure": None, "final": None}, budgets={"crash": 2, "in_job": 0}),
    Case("no warm restart for the same error at the same step", RankRaised(75, "ValueError: x", "rank 1", 50, True),
         {"action": Action.ESCALATE, "entry": None, "failure": None},
         record={"failures": [{"error": "ValueError: x", "step": 75}]}),
    Case("a pruned trial's stop ends it, whatever time and budget it has", StepStopped(24, True, None, 3600.0),
         {"action": Action.END, "why": "pruned", "cause": None, "step": 24, "entry": None}, pruned=PRUNED),
    Case("a pruned trial is not restarted after a crash either", StepFailed(1, (err(BAD), None)),
         {"action": Action.END, "why": "pruned", "failure": None, "entry": None}, alloc=WHOLE, pruned=PRUNED),
    Case("a pruned trial gets no warm restart", RankRaised(75, "ValueError: x", "rank 1", 50, True),
         {"action": Action.ESCALATE, "entry": None}, pruned=PRUNED),
    # The crash-loop breaker: the last 3 restarts, each after a failure, came back to step 20.
    Case("three failed restarts back to the same step end the run, budget left", StepFailed(1, (err(PEER), None)),
         {"action": Action.END, "why": "no_progress", "cause": Cause.CRASH, "entry": None},
         budgets=ROOMY, record={"restarts": LOOP}, alloc=WHOLE),
    Case("so do a hang and a lost node among them", StepFailed(1, (None, None), hangs=(HangMarker(1, 60.0, 0.0),)),
         {"action": Action.END, "why": "no_progress", "cause": Cause.HANG},
         budgets=ROOMY, record={"restarts": [LOOP[0], {**LOOP[1], "cause": "hang"},
                                             {**LOOP[2], "cause": "node_failure"}]}),
    Case("the breaker gives no warm restart either", RankRaised(40, "ValueError: x", "rank 1", 20, True),
         {"action": Action.ESCALATE, "entry": None}, budgets=ROOMY, record={"restarts": LOOP}),
    Case("a restart that came back further on is progress", StepFailed(1, (err(PEER), None)),
         {"action": Action.RESTART_IN_JOB, "cause": Cause.CRASH},
         budgets=ROOMY, record={"restarts": [*LOOP[:2], {**LOOP[2], "resumed_step": 40}]}, alloc=WHOLE),
    Case("a preemption among them is not the run's failure", StepFailed(1, (err(PEER), None)),
         {"action": Action.RESTART_IN_JOB, "cause": Cause.CRASH},
         budgets=ROOMY, record={"restarts": [LOOP[0], {**LOOP[1], "cause": "preemption"}, LOOP[2]]}, alloc=WHOLE),
    Case("restarts whose resumed step nobody recorded prove nothing", StepFailed(1, (err(PEER), None)),
         {"action": Action.RESTART_IN_JOB, "cause": Cause.CRASH},
         budgets=ROOMY, record={"restarts": [{**r, "resumed_step": None} for r in LOOP]}, alloc=WHOLE),
    Case("two such restarts are not yet a loop", StepFailed(1, (err(PEER), None)),
         {"action": Action.RESTART_IN_JOB, "cause": Cause.CRASH}, budgets=ROOMY, record={"restarts": LOOP[:2]},
         alloc=WHOLE),
    Case("no_progress_restarts 0 turns the breaker off", StepFailed(1, (err(PEER), None)),
         {"action": Action.RESTART_IN_JOB, "cause": Cause.CRASH},
         budgets={**ROOMY, "no_progress_restarts": 0}, record={"restarts": LOOP}, alloc=WHOLE),
    # straggler_action: replace, a straggler named for its patience: replaced as a lost node is.
    Case("a straggler with a spare node held is replaced in the job", SLOW,
         {"action": Action.REPLACE_IN_JOB, "cause": Cause.NODE_FAILURE, "nodes": 2, "exclude": ("node2",),
          "avoid_next": ()}, alloc=ROOM),
    Case("elastic, the ranks go on without the straggler's node", SLOW,
         {"action": Action.REPLACE_IN_JOB, "nodes": 1, "exclude": ("node2",)},
         alloc=Allocation(("node1", "node2"), ("node1", "node2"), (), 2, least=1)),
    Case("with no node to spare it is left out at the next requeue", SLOW,
         {"action": Action.CONTINUE, "avoid_next": ("node2",), "entry": None}, alloc=WHOLE),
    Case("so it is with the in-job restarts spent", SLOW,
         {"action": Action.CONTINUE, "avoid_next": ("node2",)}, alloc=ROOM,
         record={"restarts": [{**LOOP[1], "n": 0}]}),
    Case("and with the node_failure budget spent", SLOW, {"action": Action.CONTINUE},
         budgets={"node_failure": 0, "in_job": 1}, alloc=ROOM),
    Case("an allocation Slurm cannot describe keeps the ranks going", SLOW, {"action": Action.CONTINUE}),
    Case("a pruned trial's straggler is still only a straggler", SLOW, {"action": Action.CONTINUE},
         alloc=WHOLE, pruned=PRUNED),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_policy_table(case: Case) -> None:
    decision = policy.decide(case.state(), case.event)
    assert {k: getattr(decision, k) for k in case.expect} == case.expect
    assert "\n" not in decision.message


def test_a_restart_in_the_job_carries_its_entry_and_the_failure_it_noted() -> None:
    decision = policy.decide(CASES[1].state(), CASES[1].event)
    assert decision.entry is not None and decision.failure is not None
    e = decision.entry
    assert (e.kind, e.cause, e.n, e.in_job, e.step, e.nodes, e.exclude) == ("in_job", Cause.CRASH, 0, 1, 30, 2, [])
    assert (decision.failure.error, decision.failure.step) == ("ValueError: bad batch", 30)
    spare = next(c for c in CASES if c.alloc is SPARE and c.attempt == 0)
    lost = policy.decide(spare.state(), spare.event)
    assert lost.entry is not None and (lost.entry.nodes_lost, lost.entry.exclude) == (["node2"], ["node4"])


def test_a_warm_restart_entry_counts_its_lost_steps_and_its_source() -> None:
    case = next(c for c in CASES if c.name == "a warm restart spends in_job and crash")
    decision = policy.decide(case.state(), RankRaised(60, "ValueError: x", "rank 1", 59, True))
    e = decision.entry
    assert e is not None and (e.kind, e.in_job, e.resumed_step, e.lost_steps, e.live) == ("warm", 1, 59, 1, True)


def test_the_health_gate_records_the_nodes_it_found_bad() -> None:
    case = next(c for c in CASES if isinstance(c.event, HealthFailed))
    decision = policy.decide(case.state(), case.event)
    assert [(u.node, u.problems) for u in decision.unhealthy] == [("node2", ["gpu 3 missing"])]


def test_the_table_covers_every_action_and_every_event() -> None:
    """A loop over cases asserts what they cover: each Action, and each kind of Event, comes up."""
    seen = {policy.decide(c.state(), c.event).action for c in CASES}
    assert seen == set(Action)
    assert {type(c.event) for c in CASES} == {StepFailed, StepStopped, HealthFailed, RankRaised, StragglerLasted}


def test_the_policy_is_pure_it_imports_no_io() -> None:
    """decide() reads nothing and runs nothing: the policy module imports only records, types and
    the Decision, never Slurm, files or processes."""
    tree = ast.parse((ROOT / "slurmkit" / "supervisor" / "policy.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    allowed = {"__future__", "collections", "dataclasses", "slurmkit.common.cause", "slurmkit.common.markers",
               "slurmkit.common.node_ledger", "slurmkit.common.outcomes", "slurmkit.common.record",
               "slurmkit.supervisor.allocation", "slurmkit.supervisor.decision"}
    assert imported <= allowed, imported - allowed


def test_the_decision_blames_the_nodes_it_can_name_for_the_ledger() -> None:
    health = next(c for c in CASES if isinstance(c.event, HealthFailed))
    assert policy.decide(health.state(), health.event).blame == (("node2", "health_gate"),)
    spare = next(c for c in CASES if c.alloc is SPARE and c.attempt == 0)
    assert ("node2", "lost") in policy.decide(spare.state(), spare.event).blame
    hung = Case("rank 1 hung", StepFailed(1, (None, None), (HangMarker(1, 60.0, 0.0),)), {}, alloc=WHOLE,
                record={"resources": {"tasks_per_node": 1}})
    assert policy.decide(hung.state(), hung.event).blame == (("node2", "hang"),)
    hung.attempt = 1  # after an in-job restart the step's node order is not the job's: no one is named
    assert policy.decide(hung.state(), hung.event).blame == ()
    crash = CASES[1]
    assert policy.decide(crash.state(), crash.event).blame == ()  # a crash blames no node


def test_a_straggler_replaced_in_the_job_carries_its_entry() -> None:
    case = next(c for c in CASES if c.alloc is ROOM and c.expect["action"] is Action.REPLACE_IN_JOB)
    e = policy.decide(case.state(), case.event).entry
    assert e is not None and (e.kind, e.cause, e.in_job, e.exclude, e.nodes) == (
        "in_job", Cause.NODE_FAILURE, 1, ["node2"], 2)


def test_a_node_whose_ranks_alone_crash_twice_is_blamed() -> None:
    """Rank 2 (node2, two ranks a node) raised by itself; rank 0's error is a peer's. The first time
    the failure notes node2; the second, with that failure on record, blames it. An error every
    node raised (the code's) names no node."""
    alone = (err(PEER), None, err(BAD), None)
    first = Case("node2 crashes", StepFailed(1, alone), {}, alloc=WHOLE, record={"resources": {"tasks_per_node": 2}})
    decision = policy.decide(first.state(), first.event)
    assert decision.failure is not None and decision.failure.node == "node2" and decision.blame == ()
    first.record["failures"] = [{"error": "OSError: x", "step": 10, "node": "node2"}]
    assert policy.decide(first.state(), first.event).blame == (("node2", "crash"),)
    everywhere = StepFailed(1, (err(BAD), None, err(BAD), None))
    again = policy.decide(first.state(), everywhere)
    assert again.failure is not None and again.failure.node is None and again.blame == ()
    one_node = Case("one node", StepFailed(1, alone), {}, alloc=Allocation(("node1",), ("node1",), (), 1),
                    record={"resources": {"tasks_per_node": 4}, "failures": [{"error": "x", "node": "node1"}]})
    assert policy.decide(one_node.state(), one_node.event).blame == ()
