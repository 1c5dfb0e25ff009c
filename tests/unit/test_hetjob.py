"""Heterogeneous runs (spec components) without a cluster: the spec, each part's resolution, the one
script, each part's step and what a rank is told (docs/heterogeneous.md). tests/cluster/test_cluster_hetjob.py
runs them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurmkit.common import components, ports
from slurmkit.config.runspec import RunSpec
from slurmkit.errors import ConfigError, SlurmkitError
from slurmkit.load.loader import resolve
from slurmkit.runs import jobs
from slurmkit.slurm import steps
from slurmkit.sweeps import spec as sweeps_spec
from tests.unit.test_bad_input import refused
from tests.unit.test_containers import CONTAINERS
from tests.unit.test_render import check_shell, supervisor_call

RL: dict[str, Any] = {
    "name": "rl",
    "components": {"trainer": {"command": "python trainer.py", "resources": {"nodes": 1, "tasks_per_node": 1},
                               "env": {"ROLE": "learner"}},
                   "rollout": {"command": "python rollout.py", "resources": {"nodes": 2, "tasks_per_node": 2,
                                                                             "cpus_per_task": 2}}},
    "resources": {"time": "00:30:00", "mem": "2G"},
    "env": {"SEED": "1"},
}


def spec(**changes: Any) -> dict[str, Any]:
    return {**RL, **changes}


def test_each_part_is_resolved_over_the_runs_top_level_and_the_profile() -> None:
    resolved = resolve(RL, "devcluster")
    trainer, rollout = resolved.parts
    assert (trainer.name, trainer.group, trainer.primary) == ("trainer", 0, True)
    assert (rollout.name, rollout.group, rollout.primary) == ("rollout", 1, False)
    r = rollout.resolved.resources
    assert (r.nodes, r.tasks_per_node, r.cpus_per_task, r.time, r.mem) == (2, 2, 2, "00:30:00", "2G")
    assert rollout.resolved.spec.command == "python rollout.py" and rollout.resolved.spec.env == {"SEED": "1"}
    assert trainer.resolved.spec.env == {"SEED": "1", "ROLE": "learner"}
    # The run's own shape is its primary part's: its logs, result and task count are that part's.
    assert resolved.shape.num_tasks == 1 and resolved.resources == trainer.resolved.resources
    assert resolve(spec(result="rollout"), "devcluster").shape.num_tasks == 4


def test_the_script_is_one_heterogeneous_job_and_each_part_its_own_step(tmp_path: Path) -> None:
    request = jobs.dry_run(resolve(RL, "devcluster"))
    check_shell(request.script, tmp_path)
    header = [ln for ln in request.script.splitlines() if ln.startswith("#SBATCH")]
    split = header.index("#SBATCH hetjob")
    first, second = header[:split], header[split + 1:]
    assert "#SBATCH --nodes=1" in first and "#SBATCH --ntasks-per-node=1" in first
    assert {"#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2", "#SBATCH --cpus-per-task=2",
            "#SBATCH --partition=debug", "#SBATCH --time=00:30:00"} <= set(second)
    assert header.count("#SBATCH hetjob") == 1 and not any("--signal" in h or "--requeue" in h for h in second)
    plan = request.plan
    assert plan is not None and [p.name for p in plan.parts] == ["trainer", "rollout"]
    run_dir = request.run_paths.run_dir
    assert plan.parts[0].run_dir == str(run_dir) and plan.parts[1].run_dir == str(run_dir / "parts" / "rollout")
    argv = steps.part(plan, 1, steps.Container(), "77")
    assert argv[:2] == ["srun", "--het-group=1"]
    # Slurm's %j in a het group's step is the component's own id: the logs name the job's.
    assert f"--output={run_dir}/parts/rollout/submitit/77_%t_log.out" in argv
    assert argv[-1] == f"{run_dir}/parts/rollout/submitit"  # the part's own submitit worker folder


@pytest.mark.parametrize("runtime", sorted(CONTAINERS))
def test_a_part_runs_in_its_own_container_and_the_others_in_the_profiles(runtime: str, tmp_path: Path) -> None:
    """The rollout in a container of its own (each runtime), the trainer in the profile's (pyxis) or in
    none: each part's step gets its own container's srun options or prefix, and its own interpreter."""
    own = {**CONTAINERS[runtime], "python": "/opt/rollout/bin/python"}
    if runtime == "pyxis":  # another image than the profile's
        own["image"] = "nvcr.io#nvidia/rollout:24.05"
    profile = tmp_path / "p.yaml"
    for base in ({"extends": "devcluster"}, {"extends": "devcluster", "container": CONTAINERS["pyxis"]}):
        profile.write_text(yaml.safe_dump(base))
        het = spec(components={**RL["components"], "rollout": {**RL["components"]["rollout"], "container": own}})
        request = jobs.dry_run(resolve(het, str(profile)))
        check_shell(request.script, tmp_path)
        plan, container = supervisor_call(request.script)
        trainer, rollout = (steps.part(plan, g, container, "77") for g in (0, 1))
        assert "/opt/rollout/bin/python" in rollout and "/opt/rollout/bin/python" not in trainer
        # docker's image is in the batch shell's function the prefix calls: the part's own
        image = own["image"] if runtime != "docker" else 'slurmkit_docker_rank_1 "$@"'
        assert any(image in a for a in rollout) and not any(image in a for a in trainer)
        assert any("nvcr.io#nvidia/pytorch" in a for a in trainer) == ("container" in base)


def test_a_container_on_the_local_executor_is_refused_naming_the_part(tmp_path: Path) -> None:
    """The local profile runs every rank on this machine's interpreter: a part's container would be
    left out without a word."""
    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump(spec(components={**RL["components"], "rollout": {
        "command": "x", "container": CONTAINERS["apptainer"]}})))
    line = refused(["submit", str(path), "-p", "local"]).stderr
    assert f"{path}:components.rollout.container" in line


def test_a_rank_is_told_its_part_and_where_every_part_is() -> None:
    batch = {"SLURM_JOB_NODELIST_HET_GROUP_0": "node1", "SLURM_JOB_NODELIST_HET_GROUP_1": "node[2-3]"}
    shared = components.variables(["trainer", "rollout"], batch)
    assert shared["SLURMKIT_ROLLOUT_HOST"] == "node2" and shared["SLURMKIT_ROLLOUT_NODES"] == "node2,node3"
    found = components.components({**shared, components.COMPONENT_ENV: "rollout"})
    assert list(found) == ["trainer", "rollout"]
    assert found["trainer"].host == "node1" and not found["trainer"].mine
    assert found["rollout"].nodes == ("node2", "node3") and found["rollout"].mine and found["rollout"].group == 1
    assert components.components({}) == {}
    # Each part its own rendezvous port, so two parts' rank 0 can share a node.
    assert ports.training_port("4999", 1) != ports.training_port("4999", 0)


@pytest.mark.parametrize(("changes", "field"), [
    ({"command": "python x.py"}, "command"),
    ({"components": {}}, "components"),
    ({"components": {"trainer": {}}}, "components.trainer"),
    ({"components": {"roll-out": {"command": "x"}}}, "components"),
    ({"components": {"a": {"command": "x"}, "A": {"command": "y"}}}, "components"),
    ({"result": "critic"}, "result"),
    ({"launcher": "torchrun"}, "launcher"),
    ({"components": {"trainer": {"command": "x", "container": {"runtime": "apptainer", "image": "torch"}}}},
     "components.trainer.container"),
])
def test_bad_components_are_one_line_naming_the_field(changes: dict[str, Any], field: str, tmp_path: Path) -> None:
    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump(spec(**changes)))
    line = refused(["render", str(path), "-p", "devcluster"]).stderr
    assert field in line and str(path) in line
    assert not (tmp_path / "runs").exists()


def test_a_part_no_partition_can_hold_is_refused_naming_the_part(monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmkit.errors import PreflightError
    from slurmkit.slurm import commands, preflight

    monkeypatch.setattr(commands, "show_partitions", lambda: {
        "debug": {"Default": "YES", "TotalNodes": "2", "MaxTime": "60", "MaxNodes": "UNLIMITED"}})
    resolved = resolve(spec(components={**RL["components"], "rollout": {"command": "x", "resources": {"nodes": 3}}}),
                       "devcluster")
    with pytest.raises(PreflightError) as caught:
        preflight.check(resolved)
    assert caught.value.where == "components.rollout.resources.nodes"


def test_what_a_heterogeneous_run_cannot_be_yet_is_refused_in_one_line(tmp_path: Path) -> None:
    searched = tmp_path / "search.yaml"
    searched.write_text(yaml.safe_dump({**RL, "sweep": {"search": {
        "params": {"env.X": {"choice": ["a", "b"]}}, "trials": 2, "metric": "loss"}}}))
    with pytest.raises(ConfigError) as search:
        sweeps_spec.load(searched)
    assert search.value.where is not None and search.value.where.endswith(":sweep.search")
    shrinking = spec(components={"trainer": {"command": "x", "resources": {"spare_nodes": 1}}})
    with pytest.raises(ConfigError) as spare:
        resolve(shrinking, "devcluster")
    assert spare.value.where is not None and spare.value.where.endswith("components.trainer.resources")
    contained = spec(components={**RL["components"], "rollout": {"command": "x", "container": CONTAINERS["apptainer"]}})
    with pytest.raises(SlurmkitError) as staged:  # a part's container brings its own environment
        jobs.dry_run(resolve(contained, "devcluster", ["profile.stage.env=true"]))
    assert staged.value.where == "profile.stage"


def test_a_staged_heterogeneous_job_stages_every_components_nodes_and_every_part_runs_the_copy(
        tmp_path: Path) -> None:
    request = jobs.dry_run(resolve(RL, "devcluster", ["profile.stage.env=true"]))
    check_shell(request.script, tmp_path)
    assert 'slurmkit_stage_groups=(0 1 )' in request.script  # each het group's nodes in turn
    assert 'slurmkit_on=(--het-group="$1")' in request.script and '--jobid="$slurmkit_job"' in request.script
    assert request.plan is not None and request.plan.staged_from is not None
    os.environ[steps.STAGED_PYTHON_ENV] = "/local/env-x/bin/python"
    try:
        argvs = [steps.part(request.plan, g, steps.Container(), "7") for g in (0, 1)]
    finally:
        del os.environ[steps.STAGED_PYTHON_ENV]
    assert all("/local/env-x/bin/python" in a and request.plan.staged_from not in a for a in argvs)


def test_a_train_task_part_checks_its_own_batch_against_its_own_world() -> None:
    train = {"task": "train", "config": {"model": "digits", "batch_size": 9}, "resources": {"tasks_per_node": 2}}
    with pytest.raises(ConfigError) as caught:
        resolve(spec(components={**RL["components"], "learner": train}), "devcluster")
    assert caught.value.where is not None and caught.value.where.endswith("components.learner:config.batch_size")


def test_the_primary_part_is_the_result_part_or_the_first() -> None:
    assert RunSpec.model_validate(RL).primary == "trainer"
    assert RunSpec.model_validate(spec(result="rollout")).primary == "rollout"
    assert RunSpec.model_validate({"name": "x", "command": "y"}).primary is None
    assert os.environ.get(components.COMPONENTS_ENV) is None  # nothing above leaked into this process


def test_the_docs_example_is_the_shipped_one_and_renders_a_checked_script(tmp_path: Path) -> None:
    import yaml

    from tests.conftest import EXAMPLES, ROOT

    text = (ROOT / "docs" / "heterogeneous.md").read_text()
    shown = yaml.safe_load(text.split("```yaml\n", 1)[1].split("```", 1)[0])
    assert shown == yaml.safe_load((EXAMPLES / "rl.yaml").read_text())
    request = jobs.dry_run(resolve(EXAMPLES / "rl.yaml", "devcluster"))
    check_shell(request.script, tmp_path)
    assert request.plan is not None and [p.name for p in request.plan.parts] == ["trainer", "rollout"]


def test_sacct_and_squeue_see_a_heterogeneous_job_as_one_on_every_components_nodes() -> None:
    from slurmkit.slurm import parse

    sacct = ("7+0|COMPLETED|None|node1|00:00:30|0:0|2026-01-01T10:00:00|2026-01-01T10:00:01|2026-01-01T10:00:31\n"
             "7+1|COMPLETED|None|node[2-3]|00:00:30|0:0|2026-01-01T10:00:00|2026-01-01T10:00:01|2026-01-01T10:00:31\n"
             "8|FAILED|None|node4|00:00:05|1:0|2026-01-01T10:00:00|2026-01-01T10:00:01|2026-01-01T10:00:06\n")
    found = parse.het_jobs(["7", "8"], parse.sacct(sacct))
    assert set(found) == {"7", "8"}  # one incarnation, not one per component
    (inc,) = found["7"].history
    assert (found["7"].state, found["7"].nodes, inc.nodes, inc.job_id) == ("COMPLETED", "node1,node[2-3]",
                                                                          "node1,node[2-3]", "7")
    assert found["8"].nodes == "node4"


def test_the_report_has_each_parts_steps_and_says_which_the_job_ended() -> None:
    from slurmkit.insight.report_data import part_spans

    events: list[dict[str, Any]] = [
        {"event": "launch", "part": "trainer", "time": 1.0, "restart_count": 0, "part_attempt": 0},
        {"event": "launch", "part": "rollout", "time": 1.0, "restart_count": 0, "part_attempt": 0},
        {"event": "part_ended", "part": "rollout", "time": 5.0, "exit_code": 1, "by_job": False},
        {"event": "decision", "time": 5.0},
        {"event": "launch", "part": "rollout", "time": 5.1, "restart_count": 0, "part_attempt": 1},
        {"event": "part_ended", "part": "trainer", "time": 9.0, "exit_code": 0, "by_job": False},
        {"event": "part_ended", "part": "rollout", "time": 9.2, "exit_code": 137, "by_job": True},
    ]
    spans = part_spans(events)
    assert [(s.part, s.attempt, s.exit_code, s.by_job) for s in spans] == [
        ("trainer", 0, 0, False), ("rollout", 0, 1, False), ("rollout", 1, 137, True)]
    assert spans[1].end == 5.0 and spans[2].start == 5.1
