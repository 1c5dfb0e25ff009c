"""Safe on a shared cluster, on the real dev cluster: the batch shell's helpers and the ranks never
import from the submit folder (python -P), while the user's own code still does. (Ray in a job
refusing a client without the run's token: tests/cluster/test_cluster_ray.py, on its two jobs.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from slurmkit.common.layout import RunPaths
from slurmkit.runs import jobs
from tests.conftest import ROOT, steady, supervisor_events, write_spec

pytestmark = pytest.mark.cluster

SLURMKIT = str(ROOT / ".venv" / "bin" / "slurmkit")


def _submit(spec: Path, profile: Path, cwd: Path, wait: bool = True) -> dict[str, object]:
    proc = subprocess.run([SLURMKIT, "submit", spec.name, "-p", str(profile), "--json", *(["--wait"] if wait else [])],
                          cwd=cwd, capture_output=True, text=True, timeout=600)
    assert proc.stdout, proc.stderr
    out: dict[str, object] = json.loads(proc.stdout)
    return out


def test_nothing_slurmkit_starts_on_the_nodes_imports_from_the_submit_folder(cluster: None, tmp_path: Path,
                                                                              dev_profile: Path) -> None:
    submit_dir, marker = tmp_path / "shared", tmp_path / "PWNED"
    submit_dir.mkdir()
    for name in ("submitit.py", "slurmkit.py", "torch.py", "cloudpickle.py", "tenacity.py"):
        (submit_dir / name).write_text(f"open({str(marker)!r}, 'a').write({name!r} + ' ')\n")
    (submit_dir / "mymod.py").write_text("def f(a):\n    return a + 1\n")
    ok = write_spec(submit_dir, filename="ok.yaml", name="ok", callable="mymod:f", kwargs={"a": 41})
    out = _submit(ok, dev_profile, submit_dir)
    assert (out["state"], out["result"]) == ("COMPLETED", 42), out  # the user's own module still imports
    # A failing command: the supervisor and its restart policy run too.
    failing = write_spec(submit_dir, filename="fail.yaml", name="fail", command="exit 3")
    paths = RunPaths(Path(str(_submit(failing, dev_profile, submit_dir, wait=False)["run_dir"])))
    assert jobs.wait(paths, poller=steady(0.5), timeout_s=300).state == "FAILED"
    decided = supervisor_events(paths.run_dir, "decision")  # the policy ran, and ended it
    assert [(d["action"], d["why"]) for d in decided][-1] == ("end", "deterministic")
    assert not marker.exists(), marker.read_text()
