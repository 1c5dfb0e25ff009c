"""`slurmkit attach` and `slurmkit shell` without a cluster: the Slurm commands they become and the
shell's rc file (the shells themselves, typed into: tests/cluster/test_cluster_live.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurmkit.load.loader import resolve
from slurmkit.render import render_shell_rc
from slurmkit.runs.shell import SHELL_SPEC
from slurmkit.slurm import interactive
from slurmkit.trust import NotOwnError
from tests.unit.test_render import check_shell


def test_attach_is_one_overlapping_step_with_a_terminal_on_the_ranks_node_in_the_run_folder() -> None:
    argv = interactive.attach_argv("4711", "node2", "/runs/a b")
    assert argv[:3] == ["srun", "--overlap", "--jobid=4711"]
    assert "--nodelist=node2" in argv and "--pty" in argv and "--chdir=/runs/a b" in argv
    assert argv[-2:] == ["bash", "-i"]


@pytest.mark.parametrize("job_id", ["--uid=0", "4711 --pty", ""])
def test_a_job_id_that_is_not_one_never_reaches_srun(job_id: str) -> None:
    with pytest.raises(NotOwnError):
        interactive.attach_argv(job_id, "node2", "/runs/x")


def _resolved(tmp_path: Path, **profile: Any) -> Any:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"extends": "devcluster", "run_root": str(tmp_path / "runs"), **profile}))
    return resolve(SHELL_SPEC, str(path), ["resources.nodes=2", "resources.time=00:30:00"])


def test_shell_asks_salloc_for_the_profiles_resources_each_value_an_argument_of_its_own(tmp_path: Path) -> None:
    argv = interactive.salloc_argv(_resolved(tmp_path, partition="gpu", account="proj-1", qos="high"), "/r/rc")
    flags = argv[:argv.index("srun")]
    assert flags[0] == "salloc" and {"--nodes=2", "--time=00:30:00", "--partition=gpu", "--account=proj-1",
                                     "--qos=high", f"--job-name={interactive.SHELL_JOB_NAME}"} <= set(flags)
    assert argv[argv.index("srun"):] == ["srun", "--pty", "-N1", "-n1", "bash", "--rcfile", "/r/rc", "-i"]


def test_the_shells_rc_file_is_checked_shell_and_quotes_every_value(tmp_path: Path) -> None:
    setup = {"modules": ["cuda/12.4"], "env": {"HF_HOME": "/data/hf cache"}, "commands": ["ulimit -n 4096"]}
    check_shell(render_shell_rc(_resolved(tmp_path, setup=setup)), tmp_path)
    hostile = "x'; touch {0}; echo '$(touch {0})`touch {0}`".format(tmp_path / "ran")
    rc = tmp_path / "rc.sh"
    rc.write_text(render_shell_rc(_resolved(tmp_path, setup={"env": {"PROBE": hostile}})))
    out = subprocess.run(["bash", "-c", f'HOME={tmp_path}; source {rc} >/dev/null; printf %s "$PROBE"'],
                         capture_output=True, text=True, check=True).stdout
    assert out == hostile and not (tmp_path / "ran").exists()


def test_a_shell_on_the_local_profile_is_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from slurmkit.cli.app import app

    done = CliRunner().invoke(app, ["shell", "-p", "local"])
    assert done.exit_code == 2 and len(done.output.strip().splitlines()) == 1 and "Traceback" not in done.output


STANDIN_SRUN = """#!/bin/bash
# Stand-in for srun (named so: the cluster's own runs in tests/cluster/test_cluster_live.py): records its argv,
# then runs what follows its options here, as a one-task step on a node would.
printf '%s\\n' "$@" > "$STANDIN_LOG_DIR/srun.argv"
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
exec "$@"
"""


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer", "docker"])
def test_a_shell_in_a_container_profile_goes_through_the_ranks_container(tmp_path: Path, runtime: str) -> None:
    """The launcher `shell` and `attach` use with a container: checked shell, and run (with stand-in
    srun, apptainer and docker) it puts the command in the ranks' image, with their mounts."""
    from slurmkit.runs import shell
    from tests.unit.test_containers import CONTAINERS, profile_with

    argv, folder = shell.prepare(str(profile_with(tmp_path, CONTAINERS[runtime])), [])
    launcher = folder / shell.LAUNCHER
    check_shell(launcher.read_text(), tmp_path)
    tail = argv[argv.index("bash"):]
    assert tail == ["bash", str(launcher), "--pty", "-N1", "-n1", "--", "bash", "--rcfile",
                    str(folder / shell.RC_FILE), "-i"]
    bin_dir, logs = tmp_path / "bin", tmp_path / "logs"
    bin_dir.mkdir()
    logs.mkdir()
    (bin_dir / "srun").write_text(STANDIN_SRUN)
    (bin_dir / "srun").chmod(0o755)
    standins = Path(__file__).resolve().parents[1] / "standins"
    env = {"PATH": f"{bin_dir}:{standins}:/usr/bin:/bin", "STANDIN_LOG_DIR": str(logs), "HOME": str(tmp_path)}
    done = subprocess.run(["bash", str(launcher), "--pty", "-N1", "-n1", "--", "echo", "inside"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "inside", done.stderr
    srun = (logs / "srun.argv").read_text().splitlines()
    image = CONTAINERS[runtime]["image"]
    runs = str(tmp_path / "runs")
    if runtime == "pyxis":
        assert f"--container-image={image}" in srun and any(runs in a for a in srun if a.startswith("--container-m"))
    else:
        container = (logs / f"{runtime}.x.argv").read_text().splitlines()
        assert image in container and any(f"{runs}:{runs}" in a for a in container)
        assert container[container.index(image) + 1:] == ["echo", "inside"]
        assert ("-it" in container) == (runtime == "docker")  # docker needs a terminal of its own


def test_attach_to_a_run_in_a_container_goes_through_the_same_launcher(tmp_path: Path) -> None:
    argv = interactive.attach_argv("42", "node1", "/runs/r", launcher="/runs/r/interactive.sh")
    assert argv[:2] == ["bash", "/runs/r/interactive.sh"] and argv[-3:] == ["--", "bash", "-i"]
    assert "--overlap" in argv and "--jobid=42" in argv and "--pty" in argv
