"""The dev cluster driven from a laptop (another unix user, its own Python without torch) over one
SSH connection to the login host (tests/sshd.py): a 2-node train run submitted with --wait and
preempted on the cluster's side resumes, loses no step, and its report comes back."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmkit.common.layout import RunPaths
from slurmkit.runs import jobs
from tests import sshd as sshd_mod
from tests.conftest import EXAMPLES, executed_steps
from tests.test_cluster_faults import SETS, STEPS, wait_step, wait_until

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def laptop(login_host: sshd_mod.Sshd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[sshd_mod.Laptop]:
    with sshd_mod.laptop(login_host, "sklaptop2", tmp_path_factory.mktemp("wheel")) as user:
        yield user


def the_run(run_root: Path) -> RunPaths | None:
    """The one run under run_root, once its run.json is written."""
    found = [p for p in run_root.iterdir() if (p / "run.json").exists()] if run_root.exists() else []
    return RunPaths(found[0]) if found else None


def test_a_train_run_from_the_laptop_preempted_on_the_cluster_resumes_and_its_report_comes_back(
        cluster: None, laptop: sshd_mod.Laptop, login_host: sshd_mod.Sshd, run_root: Path) -> None:
    site = laptop.profile("dev-site", login_host, extends="devcluster", run_root=str(run_root))
    spec = laptop.write("work/gpt.yaml", (EXAMPLES / "train_gpt.yaml").read_text())
    sets = [a for s in SETS for a in ("--set", s)]
    before = login_host.accepted()
    waiter = subprocess.Popen(laptop.argv("submit", str(spec), "-p", str(site), *sets, "--wait", "--json"),
                              cwd=laptop.home, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: the_run(run_root) is not None, 120, "the run folder")
    paths = the_run(run_root)
    assert paths is not None
    wait_step(paths, 60)
    job = jobs.run_state(paths).job_id
    subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=60)  # on the cluster's side
    out, err = waiter.communicate(timeout=600)
    assert waiter.returncode == 0, err
    done = json.loads(out)
    assert done["state"] == "COMPLETED" and done["run_id"] == paths.run_id
    assert executed_steps(paths.metrics) == list(range(1, STEPS + 1))  # saved at the stop step: none lost
    status = laptop.slurmkit("status", paths.run_id, "-p", str(site), "--json")
    assert status.returncode == 0, status.stderr
    assert [(r["state"], r["restarts"]) for r in json.loads(status.stdout)] == [("COMPLETED", 1)]
    png = laptop.home / "work" / "report.png"
    rep = laptop.slurmkit("report", paths.run_id, "-p", str(site), "-o", str(png), "--json")
    assert rep.returncode == 0, rep.stderr
    info = json.loads(rep.stdout)
    assert info["incarnations"] == 2 and info["restart_causes"] == ["preemption"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert login_host.accepted() - before == 1  # the submit opened the connection; the rest reused it
