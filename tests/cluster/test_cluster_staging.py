"""stage.env on the dev cluster: each node has a private local disk at /local (its own mount, as a
real node's), the image is broadcast with sbcast and unpacked there once, and every process of the
job (the supervisor, the ranks, a command's own `python`) runs the node's copy."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RunFile
from slurmkit.devcluster import names
from slurmkit.insight import report
from slurmkit.load.loader import resolve
from slurmkit.runs import jobs
from slurmkit.runs.failure import failure
from tests.conftest import steady, write_dev_profile

pytestmark = pytest.mark.cluster

PROBE = ("import os, sys, json, slurmkit; parent = open(f'/proc/{os.getppid()}/cmdline').read().split(chr(0)); "
         "print('PROBE ' + json.dumps({'node': os.uname().nodename, 'exe': sys.executable, "
         "'slurmkit': slurmkit.__file__, 'rank_worker': parent[0], 'staged': os.environ['SLURMKIT_STAGED_PYTHON'], "
         "'data': open(os.environ['SLURMKIT_STAGE'] + '/tokens.bin').read(), "
         "'folder': sorted(os.listdir(os.environ['SLURMKIT_STAGE'] + '/ds'))}))")
ROOT = "/local/slurmkit-stage"
ROLLOUT_LOG = '"$SLURMKIT_RUN_DIR"/parts/rollout/submitit/*_0_log.out'


@pytest.fixture
def bare_nodes(cluster: None) -> Iterator[None]:
    """The nodes' local disks without a staged copy, before and after (the copies are GBs)."""
    def clear() -> None:
        for local in names.STATE_DIR.glob("local-node*"):
            shutil.rmtree(local / Path(ROOT).name, ignore_errors=True)
    clear()
    yield
    clear()


def run(profile: Path, het: bool = False) -> tuple[RunPaths, list[dict[str, str]]]:
    """Two ranks, one a node, each printing its PROBE; `het`: as a heterogeneous job of two parts
    (one a node), whose every component's nodes are staged."""
    probe = f"python -P -c \"{PROBE}\""  # -P: not slurmkit of the working folder
    spec: dict[str, object] = {"name": "staged", "command": probe,
                               "resources": {"nodes": 2, "tasks_per_node": 1, "time": "00:05:00"}}
    if het:  # the trainer (primary) waits for the rollout's probe: its end ends the rollout
        spec = {"name": "staged-het", "resources": {"time": "00:05:00"}, "components": {
            "trainer": {"command": f"{probe}; until grep -qs PROBE {ROLLOUT_LOG}; do sleep 0.2; done"},
            "rollout": {"command": f"{probe}; sleep 60"}}}
    sub = jobs.submit(resolve(spec, str(profile), ["profile.stage.env=true"]))
    paths, job = RunPaths(Path(sub.run_dir)), sub.job_id or ""
    assert jobs.wait(paths, poller=steady(1.0), timeout_s=600).state == "COMPLETED", \
        failure(paths, job).log_tail
    logs = [paths.rank_log(job, 0), paths.part("rollout").rank_log(job, 0)] if het else \
        [paths.rank_log(job, rank) for rank in (0, 1)]
    probes = [json.loads(ln.split("PROBE ", 1)[1]) for log in logs
              for ln in log.read_text().splitlines() if ln.startswith("PROBE ")]
    return paths, probes


def staged(paths: RunPaths) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for r in map(json.loads, paths.stage_log.read_text().splitlines()):
        found.setdefault(r["node"], []).append(r["action"])
    return found


def test_the_environment_is_unpacked_once_per_node_and_every_process_runs_the_nodes_copy(
        bare_nodes: None, tmp_path: Path, run_root: Path) -> None:
    """With stage.data beside it: a file (broadcast by sbcast) and a folder (copied by each node)."""
    (tmp_path / "tokens.bin").write_text("tokens")
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "a.txt").write_text("a")
    data = [{"from": str(tmp_path / "tokens.bin"), "to": "tokens.bin"}, {"from": str(tmp_path / "ds"), "to": "ds"}]
    profile = write_dev_profile(tmp_path / "staged.yaml", run_root, stage={"local_root": ROOT, "data": data})
    first, probes = run(profile)
    assert staged(first) == {"node1": ["unpacked", "data"], "node2": ["unpacked", "data"]}
    assert [(p["data"], p["folder"]) for p in probes] == [("tokens", ["a.txt"])] * 2
    assert report.collect(first).accounting.staging_s > 0  # its own category of the goodput
    env = RunFile(first).read().env
    assert env is not None and env["distributions"]["torch"].startswith("2.")
    copy = f"{ROOT}/env-{env['hash']}/"
    assert sorted(p["node"] for p in probes) == ["node1", "node2"]
    for p in probes:  # the command's python, slurmkit inside it, and the rank worker that started it
        assert p["exe"] == p["staged"] == p["rank_worker"] and p["exe"].startswith(copy)
        assert p["slurmkit"].startswith(copy)
    for node in ("node1", "node2"):  # each on its own node's disk, not on the login side's /local
        assert (names.STATE_DIR / f"local-{node}" / Path(ROOT).name / f"env-{env['hash']}" / ".ready").exists()
    assert not Path(copy).exists()
    # The next job finds it: a heterogeneous one, each component's node staged, each part on the copy.
    second, het_probes = run(profile, het=True)
    assert staged(second) == {"node1": ["reused", "data"], "node2": ["reused", "data"]}
    assert RunFile(second).read().env == env
    assert sorted(p["node"] for p in het_probes) == ["node1", "node2"]
    assert all(p["exe"] == p["staged"] and p["slurmkit"].startswith(copy) for p in het_probes)
