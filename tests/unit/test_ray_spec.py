"""`ray:` run specs without a cluster: validation, and the rendered script (bash -n, shellcheck, ports)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from slurmkit.cli.app import app
from tests.conftest import EXAMPLES
from tests.unit.test_render import check_shell

runner = CliRunner()


def render(spec: Path, *sets: str) -> tuple[int, str]:
    args = ["render", str(spec), "-p", "devcluster"]
    for s in sets:
        args += ["--set", s]
    result = runner.invoke(app, args)
    return result.exit_code, result.output


def test_ray_script_starts_head_and_workers_then_the_driver(tmp_path: Path) -> None:
    code, script = render(EXAMPLES / "ray_hostnames.yaml")
    assert code == 0, script
    check_shell(script, tmp_path)
    assert "--head --port=\"$SLURMKIT_RAY_PORT\" --include-dashboard=false" in script
    assert 'slurmkit_ray_start "$node" --address="$RAY_ADDRESS"' in script
    assert "--num-cpus=\"${SLURM_CPUS_PER_TASK:-1}\" --num-gpus=0" in script
    assert "ray stop" not in script.replace("`ray stop`", "")
    # No supervisor loop (a Ray driver owns its in-job recovery); once the driver ended, the
    # supervisor decides what its stop means, as for every run.
    assert "exec" not in script.split("-m slurmkit.supervisor")[0].splitlines()[-1]
    assert '-m slurmkit.supervisor --after-stop "$SLURMKIT_RUN_DIR"' in script
    # The driver runs through submitit on the first node, after Ray is up.
    assert re.search(r'srun --overlap -N1 -n1 -w "\$\{SLURMKIT_RAY_HOSTS\[0\]\}" .* -m slurmkit.worker.rank', script,
                     re.DOTALL)


def test_ports_are_a_separate_block_per_job_id() -> None:
    _, script = render(EXAMPLES / "ray_hostnames.yaml")
    formula = re.search(r"SLURMKIT_RAY_PORT=(\$\(\(.*\)\))", script)
    assert formula
    ports = [int(subprocess.run(["bash", "-c", f"SLURM_JOB_ID={job}; echo {formula.group(1)}"], capture_output=True,
                                text=True, check=True).stdout) for job in range(1000, 1099)]
    assert len(set(ports)) == 99 and min(ports) >= 10100 and max(ports) + 99 < 20000
    assert all(abs(a - b) >= 100 for a, b in zip(sorted(ports), sorted(ports)[1:], strict=False))


def write_ray_spec(tmp_path: Path, **ray: object) -> Path:
    (tmp_path / "drv.py").write_text("result = 1\n")
    path = tmp_path / "ray.yaml"
    path.write_text(yaml.safe_dump({"name": "r", "ray": {"driver": "drv.py", **ray}, "resources": {"nodes": 2}}))
    return path


def test_relative_driver_is_read_beside_the_spec(tmp_path: Path) -> None:
    code, script = render(write_ray_spec(tmp_path))
    assert code == 0, script
    from slurmkit.load.loader import resolve
    assert resolve(write_ray_spec(tmp_path), "devcluster").spec.ray.driver == str(tmp_path / "drv.py")  # type: ignore[union-attr]


def test_bad_ray_specs_are_one_line_errors(tmp_path: Path) -> None:
    spec = write_ray_spec(tmp_path)
    code, out = render(spec, "resources.tasks_per_node=2")
    assert code == 2 and out.count("\n") == 1
    assert f"{spec}:resources.tasks_per_node: tasks_per_node=2 with ray valid: 1" in out
    code, out = render(spec, "ray.driver=missing.py")
    assert code == 2 and f"{spec}:ray.driver: driver script not found: {tmp_path / 'missing.py'}" in out
    code, out = render(spec, "command=hostname")
    assert code == 2 and "exactly one of command, callable, function, task, ray is needed, got command, ray" in out
    code, out = render(spec, "ray.start_timeout_s=0")
    assert code == 2 and "ray.start_timeout_s" in out


def test_a_ray_run_is_refused_at_submit_when_its_python_has_no_ray(tmp_path: Path) -> None:
    """A real interpreter without Ray (a fresh venv): pre-flight asks it, before any Slurm call."""
    import sys

    from slurmkit.errors import PreflightError
    from slurmkit.load.loader import resolve
    from slurmkit.slurm.imports import check_ray_importable

    venv = tmp_path / "noray"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    profile = tmp_path / "p.yaml"
    profile.write_text(yaml.safe_dump({"extends": "devcluster", "python": str(venv / "bin" / "python")}))
    resolved = resolve(EXAMPLES / "ray_hostnames.yaml", str(profile))
    with pytest.raises(PreflightError) as err:
        check_ray_importable(resolved)
    line = str(err.value)
    assert line.startswith("profile:python: ray is not importable") and "pip install 'ray[default]'" in line
    check_ray_importable(resolve(EXAMPLES / "ray_hostnames.yaml", "devcluster"))  # this venv has Ray: passes
