"""The requeue policy's decisions that need no Slurm call (the rest runs in test_cluster_faults)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slurmkit.common import outcomes
from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RestartEntry, RunFile, RunRecord
from slurmkit.worker.ft import policy, restarts
from slurmkit.worker.ft.allocation import Allocation
from slurmkit.worker.ft.decision import Action


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


def test_every_rank_succeeded_means_completed(tmp_path: Path) -> None:
    paths = _run(tmp_path)
    _results(paths, ("success", 1), ("success", 2))
    assert policy.after_failure(paths, "7", 134, None).action is Action.COMPLETE


def test_same_error_at_the_same_step_twice_is_final(tmp_path: Path) -> None:
    trace = "Traceback (most recent call last):\nValueError: bad batch"
    paths = _run(tmp_path, failures=[{"error": "ValueError: bad batch", "step": 30}])
    paths.metrics.write_text(json.dumps({"step": 30}) + "\n")
    _results(paths, ("error", trace), ("error", trace))
    decision = policy.after_failure(paths, "7", 1, None)
    assert (decision.action, decision.why, decision.step) == (Action.END, "deterministic", 30)
    assert "deterministic error at step 30" in (RunFile(paths).read().final or "")


def test_a_restart_reads_only_the_marker_its_previous_incarnation_left(tmp_path: Path) -> None:
    paths = _run(tmp_path)
    paths.restart_request.write_text(json.dumps({"cause": "timeout", "job_id": "7", "restart_count": 1}) + "\n")
    assert restarts.restart_cause(paths, "7", 2) == ("timeout", "")
    # Left by an uncertain requeue of incarnation 0 that never went through, or by another job.
    assert restarts.marker(paths, "7", 0) is None and restarts.marker(paths, "8", 1) is None


def test_budgets_are_per_cause(tmp_path: Path) -> None:
    record = RunRecord(run_id="run", profile={"requeue": {"preemption": 2, "crash": 1}},
                       restarts=[_entry(n=1, job_id="7", cause="preemption"), _entry(n=2, job_id="7", cause="crash")])
    assert record.allowed("preemption") and record.left("preemption") == 1
    assert not record.allowed("crash") and record.left("crash") == 0
    assert record.allowed("requeue")  # an external requeue spends the preemption budget
    assert record.budget("unknown") == 2
    assert not record.model_copy(update={"final": "done"}).allowed("preemption")


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


def test_resubmit_refuses_a_local_run_in_one_line(tmp_path: Path) -> None:
    import pytest

    from slurmkit.common.errors import SlurmkitError
    from slurmkit.runs import jobs

    with pytest.raises(SlurmkitError, match="only a run on a Slurm profile can be resubmitted"):
        jobs.resubmit(_run(tmp_path, executor="local"))


def test_in_job_restarts_stop_at_the_profiles_limit_per_incarnation(tmp_path: Path, monkeypatch: Any) -> None:
    """Refusals that need no Slurm call; the restart itself runs in test_cluster_faults."""
    paths = _run(tmp_path)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    monkeypatch.setenv("SLURMKIT_ATTEMPT", "0")
    # The one in-job restart of this incarnation went to a warm restart: a cold one is refused.
    warm = _entry(n=0, in_job=1, kind="warm", job_id="7", cause="crash")
    RunFile(paths).update(profile={"requeue": {"crash": 3, "in_job": 1}}, restarts=[warm])
    whole = Allocation(("node1", "node2"), ("node1", "node2"), (), 2)
    assert policy.restart_in_job(paths, "7", "crash", 30, "rank 1 died", whole) is None
    RunFile(paths).update(profile={"requeue": {"crash": 3, "in_job": 0}}, restarts=[])
    assert policy.restart_in_job(paths, "7", "crash", 30, "rank 1 died", whole) is None
    assert RunFile(paths).read().restarts == []


def test_a_lost_node_restarts_in_the_job_only_while_a_spare_is_left(tmp_path: Path, monkeypatch: Any) -> None:
    paths = _run(tmp_path, profile={"requeue": {"node_failure": 3, "in_job": 2}})
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    monkeypatch.setenv("SLURMKIT_ATTEMPT", "0")
    # node2 left the job; node3, the spare, is held and healthy; node4 is held but drained.
    spare = Allocation(("node1", "node2", "node3", "node4"), ("node1", "node3", "node4"), ("node4",), 2)
    assert (spare.lost, spare.healthy, spare.fits) == (["node2"], ["node1", "node3"], True)
    assert policy._newly_lost(paths, "7", spare) == ["node2"]
    decision = policy.restart_in_job(paths, "7", "node_failure", 40, "lost node2", spare, ["node2"])
    assert decision is not None and decision.action is Action.RESTART_IN_JOB
    assert (decision.nodes, decision.exclude) == (2, ("node4",))  # the supervisor's srun --nodes and --exclude
    assert RunFile(paths).read().restarts[-1].exclude == ["node4"]
    assert policy._newly_lost(paths, "7", spare) == []  # node2 is not lost a second time
    monkeypatch.setenv("SLURMKIT_ATTEMPT", "1")
    gone = Allocation(spare.started, ("node1", "node4"), ("node4",), 2)
    assert not gone.fits and policy._newly_lost(paths, "7", gone) == ["node3"]
    assert policy.restart_in_job(paths, "7", "node_failure", 60, "lost node3", gone, ["node3"]) is None
    assert policy.restart_in_job(paths, "7", "crash", 60, "?", None) is None  # Slurm could not say


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
    found = policy.this_attempt(paths, "7", 2)
    assert found[0] is not None and found[0].peer_failed and found[0].error_line.startswith("RuntimeError: Got")
    assert policy.error_signature(found) is None
    own = "Traceback (most recent call last):\nValueError: bad batch\n\nAt:\n  loader.py(3): next\n"
    _results(paths, ("error", own), ("error", peer))
    assert policy.error_signature(policy.this_attempt(paths, "7", 2)) == "ValueError: bad batch"



def test_a_warm_restart_spends_both_budgets_and_the_same_error_twice_ends_the_run(
        tmp_path: Path, monkeypatch: Any) -> None:
    paths = _run(tmp_path, profile={"requeue": {"crash": 2, "in_job": 2}})
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    decision = policy.restart_warm(paths, "7", 75, "ValueError: once", "rank 1: ValueError: once", 50)
    assert decision is not None
    assert (decision.action, decision.cause, decision.step) == (Action.RESTART_WARM, "crash", 75)
    assert RunFile(paths).read().left("crash") == 1
    (entry,) = RunFile(paths).read().restarts
    assert (entry.in_job, entry.kind, entry.resumed_step, entry.lost_steps) == (1, "warm", 50, 25)
    # The srun step that the warm restart kept is still the incarnation's own: its start finds no entry.
    assert restarts.note_resumed(paths, "7", 0, 1, 50) is None
    # The same error at the same step again: deterministic, the run ends; no entry, no budget spent.
    assert policy.restart_warm(paths, "7", 75, "ValueError: once", "rank 1", 50) is None
    record = RunFile(paths).read()
    assert len(record.restarts) == 1 and "deterministic error at step 75" in (record.final or "")


def test_a_refused_warm_restart_leaves_the_failure_to_the_batch_shell(tmp_path: Path, monkeypatch: Any) -> None:
    """in_job spent: nothing is noted, so the batch shell's own reading of the same error (after
    the ranks re-raise) is its first, not a 'same error twice'."""
    paths = _run(tmp_path, profile={"requeue": {"crash": 2, "in_job": 0}})
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    assert policy.restart_warm(paths, "7", 75, "ValueError: x", "rank 1: ValueError: x", 50) is None
    record = RunFile(paths).read()
    assert record.failures == [] and record.final is None


def test_an_elastic_job_that_lost_a_node_goes_on_with_the_nodes_left(tmp_path: Path, monkeypatch: Any) -> None:
    paths = _run(tmp_path, profile={"requeue": {"node_failure": 3, "in_job": 2}})
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    monkeypatch.setenv("SLURMKIT_ATTEMPT", "0")
    left = Allocation(("node1", "node2"), ("node1",), (), 2, least=1)  # elastic: a step may run on 1
    assert (left.lost, left.fits, left.step_nodes) == (["node2"], True, 1)
    assert not Allocation(("node1", "node2"), ("node1",), (), 2).fits  # not elastic: a requeue
    decision = policy.restart_in_job(paths, "7", "node_failure", 40, "lost node2", left, ["node2"])
    assert decision is not None and decision.action is Action.RESTART_IN_JOB
    assert (decision.nodes, decision.exclude) == (1, ())
    assert not Allocation(("node1", "node2"), (), (), 1, least=1).fits  # nothing left


def test_every_writer_of_a_restart_entry_writes_a_restart_entry(tmp_path: Path, monkeypatch: Any) -> None:
    """The requeue's, the in-job restart's and the warm restart's entries all read back as RestartEntry."""
    paths = _run(tmp_path, profile={"requeue": {"crash": 3, "preemption": 2, "in_job": 2}})
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    monkeypatch.setenv("SLURMKIT_ATTEMPT", "0")
    paths.restart_request.write_text(json.dumps({"cause": "preemption", "job_id": "7", "restart_count": 0}) + "\n")
    restarts.record_restart(paths, "7", 1, 40)
    whole = Allocation(("node1", "node2"), ("node1", "node2"), (), 2)
    assert policy.restart_in_job(paths, "7", "crash", 50, "rank 1 died", whole) is not None
    assert policy.restart_warm(paths, "7", 60, "ValueError: x", "rank 1: ValueError: x", 59, live=True) is not None
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
