"""A command's Python script is checked at submit: every module it imports at its top level must be
importable by the interpreter the command names, else one line before anything is queued (issue
31, item 2). Real interpreters: this venv's, and a fresh venv without torch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from slurmkit.errors import PreflightError
from slurmkit.load.loader import resolve
from slurmkit.slurm.imports import check_command_imports, command_python, missing, script_imports
from tests.conftest import write_spec

SCRIPT = """\
from __future__ import annotations
import os, torch.distributed as dist
from helpers import shape
try:
    import optional_thing
except ImportError:
    optional_thing = None

def main():
    import inside_a_function
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    (tmp_path / "helpers.py").write_text("shape = 1\n")
    path = tmp_path / "run.py"
    path.write_text(SCRIPT)
    return path


def test_a_scripts_top_level_imports_are_what_it_needs_unconditionally(script: Path) -> None:
    assert script_imports(script) == ["os", "torch", "helpers"]


def test_the_commands_python_is_the_ranks_own_where_its_folder_has_one(bare_python: Path) -> None:
    assert command_python("OMP_NUM_THREADS=1 python -u run.py --lr 1", str(bare_python)) == (
        str(bare_python.parent / "python"), ["-u", "run.py", "--lr", "1"])
    assert command_python("/opt/py/bin/python3 x.py", str(bare_python)) == ("/opt/py/bin/python3", ["x.py"])
    assert command_python("bash train.sh", str(bare_python)) is None


def test_missing_asks_the_interpreter_itself(script: Path, bare_python: Path) -> None:
    helpers = [str(script.parent)]
    assert missing(sys.executable, ["os", "torch", "helpers"], helpers) == []
    assert missing(str(bare_python), ["os", "torch", "helpers"], helpers) == ["torch"]
    assert missing("/nonexistent/python", ["os"]) is None  # cannot be asked: not refused


def test_a_command_whose_python_lacks_an_import_is_refused_at_submit(tmp_path: Path, script: Path,
                                                                     bare_python: Path,
                                                                     dev_profile: Path) -> None:
    profile = tmp_path / "bare.yaml"
    profile.write_text(yaml.safe_dump({"extends": str(dev_profile), "python": str(bare_python)}))
    spec = write_spec(tmp_path, name="own", command=f"python {script} --steps 3")
    with pytest.raises(PreflightError) as err:
        check_command_imports(resolve(spec, str(profile)), str(spec))
    assert err.value.where == f"{spec}:command"
    # The profile's own interpreter has torch: the same command passes; so does a -c one-liner.
    check_command_imports(resolve(spec, str(dev_profile)), str(spec))
    check_command_imports(resolve(write_spec(tmp_path, name="c", command="python -c 'import torch'"),
                                  str(profile)), "spec")


def test_a_command_finds_what_the_runs_pythonpath_adds(tmp_path: Path, bare_python: Path, dev_profile: Path) -> None:
    """A package installed into a folder of its own (pip install --target) that the run's env puts on
    PYTHONPATH is importable by the ranks: not refused. Without that env it is."""
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "only_here.py").write_text("")
    script = tmp_path / "uses.py"
    script.write_text("import only_here\n")
    spec = write_spec(tmp_path, name="own", command=f"python {script}", env={"PYTHONPATH": str(tmp_path / "extra")})
    check_command_imports(resolve(spec, str(dev_profile)), str(spec))
    bare = write_spec(tmp_path, filename="bare.yaml", name="own", command=f"python {script}")
    with pytest.raises(PreflightError):
        check_command_imports(resolve(bare, str(dev_profile)), str(bare))
