"""A non-editable install from the wheel carries templates and profiles and works from any folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import ROOT


def test_wheel_ships_templates_and_profiles_and_runs_elsewhere(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(dist), str(ROOT)], check=True, capture_output=True)
    wheel = next(dist.glob("slurmkit-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "slurmkit/_data/templates/sbatch.sh.j2" in names
    assert "slurmkit/_data/templates/partials/launch.sh.j2" in names
    assert "slurmkit/_data/cluster_profiles/local.yaml" in names
    assert "slurmkit/_data/cluster_profiles/devcluster.yaml" in names

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                    str(wheel)], check=True, capture_output=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    spec = elsewhere / "spec.yaml"
    spec.write_text("name: w\ncommand: 'true'\n")
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = subprocess.run(
        [sys.executable, "-c", "import slurmkit, slurmkit.resources as r; "
         "print(slurmkit.__file__); print(r.shipped_dir('templates'))"],
        cwd=elsewhere, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert where[0].startswith(str(target)) and where[1].startswith(str(target))
    listed = subprocess.run([sys.executable, "-m", "slurmkit", "profiles", "list", "--json"], cwd=elsewhere,
                            env=env, capture_output=True, text=True, check=True).stdout
    assert all(p["path"].startswith(str(target)) for p in json.loads(listed))
    script = subprocess.run([sys.executable, "-m", "slurmkit", "render", "spec.yaml", "-p", "devcluster"],
                            cwd=elsewhere, env=env, capture_output=True, text=True, check=True).stdout
    assert "#SBATCH --partition=debug" in script
