"""Containers without a cluster: each runtime renders, passes bash -n and shellcheck, and bad fields are refused."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from slurmkit.cli.app import app
from slurmkit.load.loader import resolve
from slurmkit.runs.jobs import dry_run
from tests.conftest import EXAMPLES, ROOT
from tests.unit.test_render import check_shell, step_argv, supervisor_call

STANDINS = ROOT / "tests" / "standins"

runner = CliRunner()

CONTAINERS: dict[str, dict[str, Any]] = {
    "pyxis": {"runtime": "pyxis", "image": "nvcr.io#nvidia/pytorch:24.05-py3", "mounts": ["/data:/data:ro"],
              "workdir": "/workspace", "env": {"HF_HOME": "/data/hf cache"}, "python": "/usr/bin/python"},
    "apptainer": {"runtime": "apptainer", "image": "/images/torch.sif", "mounts": ["/data:/data:ro"],
                  "workdir": "/work", "env": {"HF_HOME": "/data/hf cache"}, "gpus": True},
    "docker": {"runtime": "docker", "image": "pytorch/pytorch:2.5.0-cuda12.4", "mounts": ["/data:/data:z"],
               "workdir": "/work", "env": {"HF_HOME": "/data/hf cache"}, "extra_args": ["--shm-size=8g"]},
}


def profile_with(tmp_path: Path, container: dict[str, Any], **fields: Any) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"extends": "devcluster", "run_root": str(tmp_path / "runs"),
                                    "container": container, **fields}))
    return path


def script_for(tmp_path: Path, container: dict[str, Any], *sets: str, **fields: Any) -> str:
    resolved = resolve(EXAMPLES / "hostnames.yaml", str(profile_with(tmp_path, container, **fields)), list(sets))
    return dry_run(resolved).script


@pytest.mark.parametrize("runtime", sorted(CONTAINERS))
def test_every_runtime_renders_a_script_that_passes_shellcheck(tmp_path: Path, runtime: str) -> None:
    script = script_for(tmp_path, CONTAINERS[runtime], checkpoint_root=f"file://{tmp_path}/ckpt")
    check_shell(script, tmp_path)
    runs = str(tmp_path / "runs")
    # The run folder's root and a local checkpoint root are always mounted, beside the user's mounts.
    assert f"{runs}:{runs}" in script and f"{tmp_path}/ckpt:{tmp_path}/ckpt" in script
    assert "export HF_HOME='/data/hf cache'" in script


@pytest.mark.parametrize("runtime", [None, *sorted(CONTAINERS)])
def test_launcher_torchrun_renders_one_torchrun_a_node_that_passes_shellcheck(tmp_path: Path,
                                                                             runtime: str | None) -> None:
    sets = ["launcher=torchrun", "resources.tasks_per_node=2"]
    if runtime is None:
        script = dry_run(resolve(EXAMPLES / "hostnames.yaml", "devcluster", sets)).script
    else:
        script = script_for(tmp_path, CONTAINERS[runtime], *sets)
    check_shell(script, tmp_path)
    plan, container = supervisor_call(script)
    assert plan.launcher == "torchrun" and plan.standby is None
    argv = step_argv(script)
    assert {"--ntasks-per-node=1", "--ntasks=1"} <= set(argv)  # SLURM_JOB_NUM_NODES unset here: 1
    node = argv[-1]  # each node's `bash -c` line
    assert argv[-3:-1] == ["bash", "-c"] and "--nproc-per-node=2" in node
    assert "-m slurmkit.worker.torchrun_rank" in node and "-m slurmkit.worker.rank" not in node
    if runtime == "pyxis":  # srun's container options come right before the node's command
        assert argv[-3 - len(container.srun_options):-3] == container.srun_options != []


def test_pyxis_passes_its_options_to_srun_and_runs_the_container_python(tmp_path: Path) -> None:
    script = script_for(tmp_path, CONTAINERS["pyxis"])
    line = next(ln for ln in script.splitlines() if ln.startswith("SLURMKIT_SRUN_CONTAINER=("))
    assert "--container-image='nvcr.io#nvidia/pytorch:24.05-py3'" in line
    assert "--container-mounts=/data:/data:ro," in line and "--container-workdir=/workspace" in line
    assert "--container-env=HF_HOME,OMP_NUM_THREADS" in line
    argv = step_argv(script)
    image = argv.index("--container-image=nvcr.io#nvidia/pytorch:24.05-py3")
    assert argv[image + 4:image + 9] == ["/usr/bin/python", "-P", "-u", "-m", "slurmkit.worker.rank"]
    # The supervisor itself stays on the host interpreter.
    assert "/usr/bin/python -P -m slurmkit.supervisor" not in script


def test_apptainer_wraps_each_rank_with_nv_only_when_gpus_are_used(tmp_path: Path) -> None:
    no_gpu = {**CONTAINERS["apptainer"], "gpus": None}
    assert "--nv" not in script_for(tmp_path, no_gpu)
    _, container = supervisor_call(script_for(tmp_path, no_gpu, "resources.gpus_per_node=1"))
    prefix = container.rank_prefix
    assert prefix[:4] == ["apptainer", "exec", "--nv", "--bind"] and prefix[4].startswith("/data:/data:ro,")
    assert prefix[5:] == ["--pwd", "/work", "--env", "HF_HOME=/data/hf cache", "/images/torch.sif"]
    script = script_for(tmp_path, no_gpu)
    plan, container = supervisor_call(script)
    assert "--nv" not in container.rank_prefix
    # Each rank's command runs under the prefix: it ends the srun argv.
    argv = step_argv(script)
    assert argv[-len(plan.command) - len(container.rank_prefix):] == [*container.rank_prefix, *plan.command]


def test_docker_runs_one_container_per_rank_with_host_network_and_gpus(tmp_path: Path) -> None:
    script = script_for(tmp_path, {**CONTAINERS["docker"], "gpus": True})
    for fragment in ("--network host --ipc host", "args+=(--gpus all)", "args+=(-v /data:/data:z)",
                     "args+=(-w /work)", "args+=(-e HF_HOME)", "args+=(--shm-size=8g)",
                     "SLURM_*|SLURMKIT_*|SUBMITIT_*|NCCL_*", "--device /dev/infiniband",
                     "exec docker run \"${args[@]}\" pytorch/pytorch:2.5.0-cuda12.4 \"$@\"",
                     "export -f slurmkit_docker_rank"):
        assert fragment in script, fragment
    assert "--gpus" not in script_for(tmp_path, {**CONTAINERS["docker"], "gpus": False})


@pytest.mark.parametrize("container, fragment", [
    ({"runtime": "apptainer", "image": "nvcr.io#nvidia/pytorch:24.05"}, "does not fit runtime apptainer"),
    ({"runtime": "docker", "image": "/images/torch.sif"}, "does not fit runtime docker"),
    ({"runtime": "pyxis", "image": "oras://ghcr.io/x/y:1"}, "does not fit runtime pyxis"),
    ({"runtime": "docker", "image": "x", "mounts": ["/a:/b:Z:ro"]}, "invalid docker mount '/a:/b:Z:ro'"),
    ({"runtime": "apptainer", "image": "/i.sif", "mounts": ["/a:/b:z"]}, "valid: /SRC:/DST or /SRC:/DST:ro|rw"),
    ({"runtime": "pyxis", "image": "x", "mounts": ["data:/data"]}, "invalid pyxis mount 'data:/data'"),
    ({"runtime": "docker", "image": "x", "workdir": "work"}, "workdir 'work' is not absolute"),
    ({"runtime": "docker", "image": "x", "extra_args": ["--gpus all; rm -rf /"]}, "invalid extra_args entry"),
    ({"runtime": "podman", "image": "x"}, "container.runtime"),
])
def test_contradictory_container_fields_are_refused_in_one_line(tmp_path: Path, container: dict[str, Any],
                                                                fragment: str) -> None:
    path = profile_with(tmp_path, container)
    result = runner.invoke(app, ["profiles", "validate", str(path)])
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and fragment in result.output
    assert f"{path.resolve()}:container" in result.output


@pytest.mark.parametrize("runtime", sorted(CONTAINERS))
def test_ray_head_workers_and_driver_start_inside_the_container(tmp_path: Path, runtime: str) -> None:
    resolved = resolve(EXAMPLES / "ray_hostnames.yaml", str(profile_with(tmp_path, CONTAINERS[runtime])))
    script = dry_run(resolved).script
    check_shell(script, tmp_path)  # shellcheck: no container array defined and left unused (SC2034)
    wrap = '"${SLURMKIT_SRUN_CONTAINER[@]}"' if runtime == "pyxis" else '"${SLURMKIT_RANK_PREFIX[@]}"'
    joined = script.replace("\\\n", " ")
    ray_start = next(ln for ln in joined.splitlines() if "ray.scripts.scripts start" in ln)
    driver = next(ln for ln in joined.splitlines() if "slurmkit.worker.rank" in ln and ln.startswith("srun "))
    assert wrap in ray_start and wrap in driver
    python = CONTAINERS[runtime].get("python")
    if python:  # the container's interpreter starts Ray, not the host's
        assert f"{python} -P -m ray.scripts.scripts start" in ray_start


def test_an_image_whose_python_has_no_slurmkit_is_refused_at_submit(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in apptainer (a fake, tests/standins) runs the image's command on this host: an image
    python of Debian's own (no slurmkit) is refused; this interpreter (slurmkit at this version) passes."""
    from slurmkit.errors import PreflightError
    from slurmkit.slurm import imports

    image = tmp_path / "pytorch.sif"
    image.write_bytes(b"stand-in image")
    monkeypatch.setenv("PATH", f"{STANDINS}:{os.environ['PATH']}")
    monkeypatch.setenv("STANDIN_LOG_DIR", str(tmp_path))
    monkeypatch.setenv("SLURMKIT_CONTAINER_IMAGE", str(image))

    def resolved(python: str) -> Any:
        profile = tmp_path / "p.yaml"
        profile.write_text(yaml.safe_dump({"extends": "local", "container": {"runtime": "apptainer",
                                                                             "image": str(image), "python": python}}))
        return resolve({"name": "x", "command": "true"}, str(profile))

    with pytest.raises(PreflightError) as refused:
        imports.check_packages(resolved("/usr/bin/python3"))
    assert refused.value.where == "profile:container.image"
    assert (tmp_path / "apptainer.x.argv").read_text().split("\n")[:3] == ["exec", str(image), "/usr/bin/python3"]
    imports.check_packages(resolved(sys.executable))  # slurmkit at this version in the "image"


def _squashfs(tmp_path: Path, name: str, dist_info: str | None) -> Path:
    """A real squashfs image (mksquashfs, as `enroot import` writes one) of a tiny root whose
    dist-packages hold `dist_info`, if any."""
    root = tmp_path / f"{name}-root"
    packages = root / "usr" / "local" / "lib" / "python3.10" / "dist-packages"
    packages.mkdir(parents=True)
    (packages / "torch").mkdir()
    if dist_info:
        (packages / dist_info).mkdir()
        (packages / dist_info / "METADATA").write_text("Name: slurmkit\n")
    image = tmp_path / f"{name}.sqsh"
    subprocess.run(["mksquashfs", str(root), str(image), "-quiet", "-noappend"], check=True,
                   stdout=subprocess.DEVNULL)
    return image


@pytest.mark.skipif(shutil.which("mksquashfs") is None and os.environ.get("CI") != "true",
                    reason="squashfs-tools is not installed (scripts/test.sh installs it)")
def test_a_pyxis_squashfs_image_without_slurmkit_at_this_version_is_refused_at_submit(tmp_path: Path) -> None:
    """pyxis runs a squashfs file on the compute nodes; at submit its listing says which slurmkit it
    holds, with nothing in it run."""
    from slurmkit import __version__
    from slurmkit.errors import PreflightError
    from slurmkit.slurm import imports

    def resolved(image: Path) -> Any:
        profile = tmp_path / "p.yaml"
        profile.write_text(yaml.safe_dump({"extends": "local", "container": {"runtime": "pyxis",
                                                                             "image": str(image)}}))
        return resolve({"name": "x", "command": "true"}, str(profile))

    for name, dist_info, found in (("ngc", None, "none"), ("old", "slurmkit-0.0.9.dist-info", "0.0.9")):
        image = _squashfs(tmp_path, name, dist_info)
        assert imports.squashfs_slurmkit(str(image)) == found
        with pytest.raises(PreflightError) as refused:
            imports.check_packages(resolved(image))
        assert refused.value.where == "profile:container.image"
    image = _squashfs(tmp_path, "ours", f"slurmkit-{__version__}.dist-info")
    assert imports.squashfs_slurmkit(str(image)) == __version__
    imports.check_packages(resolved(image))
    imports.check_packages(resolved(tmp_path / "absent.sqsh"))  # a registry's or another host's: not asked here
    assert imports.squashfs_slurmkit(str(tmp_path / "p.yaml")) is None  # not a squashfs: cannot be read
