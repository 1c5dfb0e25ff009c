"""The decider's effects on a run folder (supervisor.effects), the restart entries a start records
(supervisor.restarts) and the budget arithmetic; the decisions themselves are tests/unit/test_policy_table.py's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slurmkit.common import outcomes
from slurmkit.common.cause import Cause
from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RestartEntry, RunFile, RunRecord
from slurmkit.supervisor import effects, policy, restarts
from slurmkit.supervisor.allocation import Allocation
from slurmkit.supervisor.decision import Action
from slurmkit.supervisor.policy import RankRaised, StepFailed

WHOLE = Allocation(("node1", "node2"), ("node1", "node2"), (), 2)


def _run(tmp_path: Path, **record: Any) -> RunPaths:
    paths = RunPaths(tmp_path / "run")
    paths.job_folder.mkdir(parents=True)
    fields = {"num_tasks": 2, "job_ids": ["7"], "profile": {"requeue": {"preemption": 2, "crash": 1, "hang": 1}},
              **record}
    RunFile(paths).create(RunRecord.model_validate({"run_id": "run", **fields}))
    return paths


def _entry(**fields: Any) -> RestartEntry:
    return RestartEntry.model_validate({"kind": "requeue", "time": "2026-12-01T00:00:00", **fields})


def _results(paths: RunPaths, *found: tuple[str, object]) -> None:
    for rank, (state, value) in enumerate(found):
        if state == outcomes.SUCCESS:
            outcomes.record(paths.outcome_file("7", rank), state, value=value)
        else:
            outcomes.record(paths.outcome_file("7", rank), state, error=str(value))


def test_a_restart_reads_only_the_marker_its_previous_incarnation_left(tmp_path: Path) -> None:
    paths = _run(tmp_path)
    paths.restart_request.write_text(json.dumps({"cause": "timeout", "job_id": "7", "restart_count": 1}) + "\n")
    assert restarts.restart_cause(paths, "7", 2) == ("timeout", "")
    # Left by an uncertain requeue of incarnation 0 that never went through, or by another job.
    assert restarts.marker(paths, "7", 0) is None and restarts.marker(paths, "8", 1) is None


def test_budgets_are_per_cause(tmp_path: Path) -> None:
    record = RunRecord(run_id="run", profile={"requeue": {"preemption": 2, "crash": 1}},
                       restarts=[_entry(n=1, job_id="7", cause="preemption"), _entry(n=2, job_id="7", cause="crash")])
    assert record.allowed(Cause.PREEMPTION) and record.left(Cause.PREEMPTION) == 1
    assert not record.allowed(Cause.CRASH) and record.left(Cause.CRASH) == 0
    assert record.allowed(Cause.REQUEUE)  # an external requeue spends the preemption budget
    assert record.budget(Cause.UNKNOWN) == 2
    assert not record.model_copy(update={"final": "done"}).allowed(Cause.PREEMPTION)


def test_lost_steps_count_the_stop_step_a_killed_save_never_logged(tmp_path: Path) -> None:
    paths = _run(tmp_path)
    assert restarts.lost_steps(paths, None) is None  # no step ran
    paths.metrics.write_text(json.dumps({"step": 100}) + "\n")
    assert restarts.lost_steps(paths, 100) == 0  # the stop's save made it
    paths.stop_marker.write_text(json.dumps({"step": 112}) + "\n")
    assert restarts.lost_steps(paths, 100) == 12  # killed in the save of step 112: 101..112 run again
    assert restarts.lost_steps(paths, None) == 112  # no checkpoint: everything


def test_a_resubmitted_job_learns_the_step_it_resumed_from_once(tmp_path: Path) -> None:
    paths = _run(tmp_path, restarts=[_entry(kind="resubmit", n=0, job_id="8", cause="resubmit")])
    paths.stop_marker.write_text(json.dumps({"step": 61}) + "\n")
    restarts.note_resumed(paths, "8", 0, 0, 61)
    (entry,) = RunFile(paths).read().restarts
    assert (entry.resumed_step, entry.lost_steps) == (61, 0) and not paths.stop_marker.exists()
    assert restarts.note_resumed(paths, "9", 0, 0, 5) is None  # another job's start changes nothing
    assert RunFile(paths).read().restarts == [entry]


def test_a_partition_preempt_mode_decides_who_brings_the_job_back() -> None:
    from slurmkit.slurm.commands import Preemption

    assert Preemption("t", "REQUEUE", "2999-01-01T00:00:00").requeues
    assert not Preemption("t", "CANCEL", "").requeues
    assert Preemption("t", "REQUEUE", "2999-01-01T00:00:00").left_s > 0
    assert Preemption("t", "REQUEUE", "2000-01-01T00:00:00").left_s == 0 == Preemption("t", "CANCEL", "?").left_s


def test_an_in_job_restart_is_its_own_entry_beside_the_incarnations(tmp_path: Path) -> None:
    entries = [_entry(n=1, job_id="7", cause="preemption", resumed_step=40),
               _entry(kind="in_job", n=1, in_job=1, job_id="7", cause="crash")]
    paths = _run(tmp_path, restarts=entries)
    paths.metrics.write_text(json.dumps({"step": 57}) + "\n")
    entry = restarts.note_resumed(paths, "7", 1, 1, 50)
    assert entry is not None and (entry.cause, entry.resumed_step, entry.lost_steps) == ("crash", 50, 7)
    assert RunFile(paths).read().restarts[0] == entries[0]  # the incarnation's own entry is untouched


def test_a_rank_that_lost_its_peer_is_no_deterministic_error(tmp_path: Path) -> None:
    """Recorded from the dev cluster: rank 1 SIGKILLed, rank 0's all-reduce fails. Twice at the same
    logged step, that once read as 'the same error twice' and ended the run FAILED."""
    peer = ("Traceback (most recent call last):\n  File \"trainer.py\", line 228, in train_step\n"
            "RuntimeError: Got the following error when running the callback: RuntimeError: [gloo/transport/tcp/"
            "pair.cc:537] Read error [10.77.0.12]:45748: Connection reset by peer.\n\nAt:\n"
            "  torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py(31): <lambda>\n")
    paths = _run(tmp_path)
    _results(paths, ("error", peer))
    found = effects.this_attempt(paths, "7", 2)
    assert found[0] is not None and found[0].peer_failed and found[0].error_line.startswith("RuntimeError: Got")
    assert policy.error_signature(found) is None
    own = "Traceback (most recent call last):\nValueError: bad batch\n\nAt:\n  loader.py(3): next\n"
    _results(paths, ("error", own), ("error", peer))
    assert policy.error_signature(effects.this_attempt(paths, "7", 2)) == "ValueError: bad batch"


def test_a_crash_noted_then_seen_again_at_its_step_ends_the_run_in_run_json(tmp_path: Path, monkeypatch: Any) -> None:
    """The effects land in run.json: the failure noted with the in-job restart's entry, then the
    verdict once the same error comes back at the same step."""
    trace = "Traceback (most recent call last):\nValueError: bad batch"
    paths = _run(tmp_path, profile={"requeue": {"crash": 3, "in_job": 2}})
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    monkeypatch.setenv("SLURMKIT_ATTEMPT", "0")
    paths.metrics.write_text(json.dumps({"step": 30}) + "\n")
    _results(paths, ("error", trace), ("error", trace))
    first = effects.decide(paths, "7", effects.step_failed(paths, "7", 1), WHOLE)
    assert (first.action, first.cause) == (Action.RESTART_IN_JOB, Cause.CRASH)
    record = RunFile(paths).read()
    assert [(f.error, f.step) for f in record.failures] == [("ValueError: bad batch", 30)]
    assert [(e.kind, e.in_job, e.step) for e in record.restarts] == [("in_job", 1, 30)]
    monkeypatch.setenv("SLURMKIT_ATTEMPT", "1")
    _results(paths, ("error", trace), ("error", trace))  # the next step's records, the same error
    again = effects.decide(paths, "7", effects.step_failed(paths, "7", 1), WHOLE)
    assert (again.action, again.why, again.step) == (Action.END, "deterministic", 30)
    record = RunFile(paths).read()
    assert "deterministic error at step 30" in (record.final or "") and len(record.restarts) == 1


def test_a_warm_restart_is_recorded_and_its_step_stays_the_incarnations_own(tmp_path: Path, monkeypatch: Any) -> None:
    paths = _run(tmp_path, profile={"requeue": {"crash": 2, "in_job": 2}})
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    decision = effects.decide(paths, "7", RankRaised(75, "ValueError: once", "rank 1: ValueError: once", 50, False))
    assert (decision.action, decision.cause, decision.step) == (Action.RESTART_WARM, Cause.CRASH, 75)
    record = RunFile(paths).read()
    assert record.left(Cause.CRASH) == 1 and [(f.error, f.step) for f in record.failures] == [("ValueError: once", 75)]
    (entry,) = record.restarts
    assert (entry.in_job, entry.kind, entry.resumed_step, entry.lost_steps) == (1, "warm", 50, 25)
    # The srun step that the warm restart kept is still the incarnation's own: its start finds no entry.
    assert restarts.note_resumed(paths, "7", 0, 1, 50) is None
    # The same error at the same step again: no warm restart, nothing written; the supervisor decides.
    assert effects.decide(paths, "7", RankRaised(75, "ValueError: once", "rank 1", 50, False)).action is Action.ESCALATE
    assert RunFile(paths).read() == record


def test_every_writer_of_a_restart_entry_writes_a_restart_entry(tmp_path: Path, monkeypatch: Any) -> None:
    """The requeue's, the in-job restart's and the warm restart's entries all read back as RestartEntry."""
    paths = _run(tmp_path, profile={"requeue": {"crash": 3, "preemption": 2, "in_job": 2}})
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    monkeypatch.setenv("SLURMKIT_ATTEMPT", "0")
    paths.restart_request.write_text(json.dumps({"cause": "preemption", "job_id": "7", "restart_count": 0}) + "\n")
    restarts.record_restart(paths, "7", 1, 40)
    paths.metrics.write_text(json.dumps({"step": 50}) + "\n")
    assert effects.decide(paths, "7", StepFailed(1, (None, None)), WHOLE).action is Action.RESTART_IN_JOB
    assert effects.decide(paths, "7", RankRaised(60, "ValueError: x", "rank 1", 59, True)).action is Action.RESTART_WARM
    entries = RunFile(paths).read().restarts
    assert [(e.kind, e.cause, e.n, e.in_job) for e in entries] == [
        ("requeue", "preemption", 1, None), ("in_job", "crash", 1, 1), ("warm", "crash", 1, 2)]
    assert (entries[1].nodes, entries[2].live, entries[2].lost_steps) == (2, True, 1)


def test_a_record_field_slurmkit_does_not_declare_is_refused_not_written(tmp_path: Path) -> None:
    """RunFile.update takes only RunRecord's fields, each checked: a typo is no silent extra key."""
    import pytest
    from pydantic import ValidationError

    paths = _run(tmp_path)
    with pytest.raises(TypeError):
        RunFile(paths).update(finale="done")
    with pytest.raises(ValidationError):
        RunFile(paths).update(num_tasks=0)
    assert RunFile(paths).read() == RunRecord.model_validate(json.loads(paths.record.read_text()))
    assert "finale" not in json.loads(paths.record.read_text())
