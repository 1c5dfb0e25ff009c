"""The job side on Debian 12's own python3 (3.11.2, the system Python of this machine kind), not only
on pyenv's 3.11.7: a venv of it with the CPU torch on disk, slurmkit's dependencies and this tree's
wheel. On 3.11.0 to 3.11.3 an enum member is pickled as `getattr(Enum, "NAME")`,
which DCP's `.metadata` holds for every tensor (its memory format): an FSDP run preempted there
never resumed (slurmkit's metadata unpickler refused `builtins.getattr`)."""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch.distributed.checkpoint.metadata as dcp_metadata

from slurmkit.worker.checkpoint import sharded

ROOT = Path(__file__).resolve().parents[2]
DEBIAN_PYTHON = Path("/usr/bin/python3")
VENV = Path("/opt/slurmkit-test-debian-job")
FIND_LINKS = ["--find-links", "/opt/wheels"] if Path("/opt/wheels").is_dir() else []


@pytest.fixture(scope="module")
def debian_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Debian's python3 in a venv with torch 2.13.0 (CPU), slurmkit's dependencies, its search extra
    (Optuna) and pytest (made once a machine); skipped loudly where there is no Debian python3, a
    failure under CI=true."""
    version = subprocess.run([str(DEBIAN_PYTHON), "-c", "import sys; print(sys.version_info[:2])"],
                             capture_output=True, text=True) if DEBIAN_PYTHON.exists() else None
    if version is None or version.stdout.strip() != "(3, 11)":
        msg = "NO DEBIAN PYTHON 3.11 HERE: the job side is not tested on it"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([str(DEBIAN_PYTHON), "-m", "venv", str(VENV)], check=True, timeout=300)
        deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
        subprocess.run([str(python), "-m", "pip", "install", "-q", *FIND_LINKS, "torch==2.13.0"], check=True,
                       timeout=900)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *FIND_LINKS, *deps, "pytest>=8", "pyyaml"],
                       check=True, timeout=900)
    search = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["search"]
    if subprocess.run([str(python), "-c", "import optuna, cmaes"], capture_output=True).returncode:  # a venv of before
        subprocess.run([str(python), "-m", "pip", "install", "-q", *FIND_LINKS, *search], check=True, timeout=900)
    wheels = tmp_path_factory.mktemp("debian-wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(ROOT)], check=True, timeout=300)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall",
                    str(next(wheels.glob("slurmkit-*.whl")))], check=True, timeout=300)
    return python


def run_there(python: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`python -P ARGV` with slurmkit from this tree first (and tests/ importable), in the tree's root."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMKIT_"))}
    return subprocess.run([str(python), "-P", *argv], cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=900)


WRITE_METADATA = """
import sys, tempfile, torch
import torch.distributed.checkpoint as dcp
folder = tempfile.mkdtemp()
dcp.save({"w": torch.zeros(2, 2)}, checkpoint_id=folder, no_dist=True)
sys.stdout.write(folder)
"""
READ_METADATA = """
import io, sys
from slurmkit.worker.checkpoint import sharded
meta = sharded._MetadataUnpickler(io.BytesIO(open(sys.argv[1] + "/.metadata", "rb").read())).load()
print(sys.version.split()[0], sorted(meta.state_dict_metadata))
"""


def test_dcp_metadata_written_by_debians_python_is_read_there_and_here(debian_python: Path) -> None:
    written = run_there(debian_python, "-c", WRITE_METADATA)
    assert written.returncode == 0, written.stderr
    folder = written.stdout.strip()
    data = (Path(folder) / ".metadata").read_bytes()
    assert b"getattr" in data  # 3.11.2's way of pickling the enum member
    read = run_there(debian_python, "-c", READ_METADATA, folder)
    assert read.returncode == 0, read.stderr
    assert read.stdout.split() == ["3.11.2", "['w']"]
    assert list(sharded._MetadataUnpickler(io.BytesIO(data)).load().state_dict_metadata) == ["w"]


class _NotAMember:
    """A pickle that asks getattr for something other than an enum member of DCP's metadata."""

    def __reduce__(self) -> tuple[object, tuple[object, str]]:
        return (getattr, (dcp_metadata._MEM_FORMAT_ENCODING, "__class__"))


def test_getattr_in_dcp_metadata_gives_enum_members_only() -> None:
    with pytest.raises(pickle.UnpicklingError):
        sharded._MetadataUnpickler(io.BytesIO(pickle.dumps(_NotAMember()))).load()
    with pytest.raises(pickle.UnpicklingError):  # getattr of a module no metadata names
        sharded._MetadataUnpickler(io.BytesIO(pickle.dumps(os.system))).load()


def test_an_fsdp_run_on_debians_python_stops_and_resumes_bitwise(debian_python: Path) -> None:
    """tests/unit/test_sharded.py's stop-and-resume, run by Debian's 3.11.2 itself."""
    done = run_there(debian_python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                     "tests/unit/test_sharded.py::test_fsdp_stopped_and_resumed_on_two_ranks_is_bitwise_the_uninterrupted_run")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout


def test_a_local_run_whose_ranks_run_debians_python_trains_and_runs_a_command(debian_python: Path,
                                                                               tmp_path: Path) -> None:
    """The whole job side (supervisor, ranks, the train task, a command's agreed stop hooks) on 3.11.2."""
    profile = tmp_path / "deb.yaml"
    profile.write_text(f"extends: local\npython: {debian_python}\nrun_root: {tmp_path / 'runs'}\n")
    train = tmp_path / "train.yaml"
    train.write_text((ROOT / "examples" / "train_digits.yaml").read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMKIT_", "PYTHON"))}
    done = subprocess.run([sys.executable, "-P", "-m", "slurmkit", "submit", str(train), "-p", str(profile),
                           "--set", "config.steps=40", "--wait", "--json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    assert answer["state"] == "COMPLETED" and answer["result"]["steps"] == 40
    version = tmp_path / "version.yaml"
    version.write_text("name: version\ncommand: python -c 'import sys; print(*sys.version_info[:3])'\n"
                       "resources: {tasks_per_node: 1}\n")
    shown = subprocess.run([sys.executable, "-P", "-m", "slurmkit", "submit", str(version), "-p", str(profile),
                            "--wait", "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert json.loads(shown.stdout)["result"]["stdout"].split() == ["3", "11", "2"]  # the ranks' own python


def test_the_local_rehearsal_and_the_named_tracebacks_on_debians_python(debian_python: Path) -> None:
    """This issue's job side on 3.11.2: a signalled local run stopped, recorded and started again
    (supervisor.local_requeue), a submitit Checkpointable going on, a local resubmit, and a __main__
    function's traceback naming its file (common.code_source), run by Debian's python itself; and a
    heterogeneous run's local supervisor (supervisor.local_parts) stopping both parts at once."""
    done = run_there(debian_python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                     "tests/unit/test_local_rehearsal.py", "tests/unit/test_from_submitit.py",
                     "tests/unit/test_local_parts.py::test_the_profiles_signal_stops_every_part_once_and_a_cancelled_run_resubmits")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "6 passed" in done.stdout


def test_a_search_driven_and_resumed_by_debians_python(debian_python: Path) -> None:
    """The login host's side of a search on 3.11.2: the study, a driver killed and resumed, the
    failed trials enqueued again (tests/unit/test_search.py, run by Debian's python itself)."""
    done = run_there(debian_python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                     "tests/unit/test_search.py")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout


def test_the_shared_cluster_refusals_on_debians_python(debian_python: Path) -> None:
    """The login host's checks of part four on 3.11.2: files read as configuration checked open, the
    checkpoint folder claimed at submit, a search's values checked and its journal lock (tests/
    test_trusted_config.py, tests/unit/test_search_refusals.py, run by Debian's python itself)."""
    done = run_there(debian_python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                     "tests/unit/test_trusted_config.py", "tests/unit/test_search_refusals.py")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout and "skipped" not in done.stdout
