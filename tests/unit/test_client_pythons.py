"""The client (a laptop, a login node) on the newer Pythons users have: 3.12 and 3.13 (pyenv's here),
each in a venv with slurmkit's wheel installed as `pip install slurmkit` does (no torch). The job
side and the login host run 3.11 (Debian's 3.11.2: tests/unit/test_debian_python.py, test_unpack.py,
test_remote.py); what the client does there is render, submit's checks, profiles and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYENV = Path.home() / ".pyenv" / "versions"
CLIENT_PYTHONS = ("3.12", "3.13")


def _interpreter(minor: str) -> Path | None:
    found = sorted(PYENV.glob(f"{minor}.*/bin/python"))
    return found[-1] if found else None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("client-wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(folder), str(ROOT)], check=True, timeout=300)
    return next(folder.glob("slurmkit-*.whl"))


@pytest.fixture(params=CLIENT_PYTHONS)
def client(request: pytest.FixtureRequest, wheel: Path) -> Path:
    """That Python's venv with this tree's wheel and its own dependencies (made once a machine)."""
    interpreter = _interpreter(str(request.param))
    if interpreter is None:
        msg = f"NO PYTHON {request.param} HERE (pyenv): the client is not tested on it"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    venv = Path(f"/opt/slurmkit-test-client-{request.param}") if os.geteuid() == 0 else (
        wheel.parent / f"venv-{request.param}")
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([str(interpreter), "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)],
                   check=True, timeout=300)
    subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheel)], check=True, timeout=600)
    return python


def sk(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "PYTHON"))}
    return subprocess.run([str(python), "-P", "-m", "slurmkit", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_client_renders_checks_and_refuses_on_newer_pythons(client: Path, tmp_path: Path) -> None:
    version = subprocess.run([str(client), "-c", "import sys; print(sys.version_info[:2] >= (3, 12))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert version == "True"
    rendered = sk(client, "render", str(ROOT / "examples" / "train_digits.yaml"), "-p", "cpu-partition", cwd=tmp_path)
    assert rendered.returncode == 0 and rendered.stdout.startswith("#!/bin/bash"), rendered.stderr
    shipped = json.loads(sk(client, "profiles", "list", "--json", cwd=tmp_path).stdout)
    assert {"local", "devcluster", "gpu-pyxis"} <= {p["name"] for p in shipped}
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ncommand: true\nresources:\n  nodes: 0\n")
    refused = sk(client, "render", str(bad), cwd=tmp_path)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    probe = ("import sys, runpy; sys.argv = ['slurmkit', 'render', sys.argv[1], '-p', 'cpu-partition']\n"
             "try:\n    runpy.run_module('slurmkit', run_name='__main__')\nexcept SystemExit:\n    pass\n"
             "print('torch' in sys.modules, file=sys.stderr)")
    light = subprocess.run([str(client), "-P", "-c", probe, str(ROOT / "examples" / "train_digits.yaml")],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert light.stderr.strip().splitlines()[-1] == "False"  # and it is not installed either
