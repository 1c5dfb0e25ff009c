"""Ray inside a Slurm allocation on the real 2-node dev cluster (ray from PyPI, the `test` extra)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from slurmkit.cli.app import app
from slurmkit.common.layout import RunPaths
from slurmkit.runs import jobs
from slurmkit.slurm import commands
from tests.conftest import EXAMPLES, steady, supervisor_events, wait_until

pytestmark = pytest.mark.cluster
runner = CliRunner()

# Each of the two jobs: a task with the run's token, then a client without it (refused) and with it.
RAY_AUTH_DRIVER = """
import os, subprocess, sys
import ray

ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
with_token = ray.get(ray.remote(lambda: 41).remote()) + 1
nodes = [n for n in ray.nodes() if n["Alive"]]
ray.shutdown()
probe = "import os, ray; ray.init(address=os.environ['RAY_ADDRESS'], log_to_driver=False); print('CONNECTED')"
runs = {}
for name, env in (("wrong_token", {"RAY_AUTH_TOKEN": "0" * 64}), ("right_token", {})):
    try:
        out = subprocess.run([sys.executable, "-c", probe], env={**os.environ, **env}, capture_output=True,
                             text=True, timeout=90)
        runs[name] = "CONNECTED" in out.stdout
    except subprocess.TimeoutExpired:
        runs[name] = False
result = {"nodes": len(nodes), "with_token": with_token, **runs,
          "mode": os.environ.get("RAY_AUTH_MODE")}
"""


def submit(*args: str) -> dict[str, str]:
    result = runner.invoke(app, ["submit", *args, "--json"])
    assert result.exit_code == 0, result.output
    data: dict[str, str] = json.loads(result.stdout)
    return data


def _log_tails(runs: list[dict[str, str]]) -> str:
    """What a failed Ray job said: its Ray logs and the batch and driver logs, the last lines of each."""
    logs = [p for r in runs for pattern in ("ray-*.log", "submitit/*_log.*") for p in Path(r["run_dir"]).glob(pattern)]
    return "\n".join(f"== {p}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:]) for p in sorted(logs))


def test_ray_driver_sees_tasks_on_both_nodes(cluster: None, dev_profile: Path) -> None:
    out = submit(str(EXAMPLES / "ray_hostnames.yaml"), "-p", str(dev_profile), "--wait")
    assert out["state"] == "COMPLETED", out
    assert out["result"] == {"hostnames": ["node1", "node2"], "nodes": 2}
    run_dir = Path(out["run_dir"])
    assert sorted(p.name.split("-", 2)[2] for p in run_dir.glob("ray-*.log")) == ["node1.log", "node2.log"]
    assert not list(Path("/tmp").glob(f"skray-{out['job_id']}-*")), "Ray temp dirs were not removed"


def test_two_ray_jobs_on_the_same_nodes_keep_separate_clusters_each_refusing_a_client_without_its_token(
        cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    driver = tmp_path / "count.py"
    driver.write_text(RAY_AUTH_DRIVER)
    spec = tmp_path / "ray.yaml"
    spec.write_text(yaml.safe_dump({"name": "ray-count", "ray": {"driver": "count.py", "start_timeout_s": 120},
                                    "resources": {"nodes": 2, "cpus_per_task": 1, "time": "00:05:00"}}))
    runs = [submit(str(spec), "-p", str(dev_profile)) for _ in range(2)]
    both_running = False
    deadline = time.monotonic() + 180
    while True:
        states = [jobs.run_state(RunPaths(Path(r["run_dir"]))).state for r in runs]
        both_running |= states == ["RUNNING", "RUNNING"]
        if not any(jobs.is_active(s) for s in states):
            break
        assert time.monotonic() < deadline, (states, _log_tails(runs))
        time.sleep(0.5)
    assert states == ["COMPLETED", "COMPLETED"], _log_tails(runs)
    assert both_running, "the two jobs never ran at the same time; the test proves nothing"
    # Each driver saw its own 2 nodes, never a merged cluster of 4; each cluster took a client with the
    # run's token and refused one with another token.
    auth = {"nodes": 2, "with_token": 42, "wrong_token": False, "right_token": True, "mode": "token"}
    assert [jobs.result(RunPaths(Path(r["run_dir"]))) for r in runs] == [auth, auth]
    for r in runs:
        assert (Path(r["run_dir"]) / "ray-token").stat().st_mode & 0o077 == 0  # the token file is the owner's alone
    ids = [r["job_id"] for r in runs]
    out = commands.run(["sacct", "--noheader", "--parsable2", "--allocations", "--jobs", ",".join(ids),
                        "--format=NodeList"])
    assert out.split() == ["node[1-2]", "node[1-2]"]


def test_preemption_stops_ray_and_the_requeued_job_runs_the_driver_again(cluster: None, tmp_path: Path,
                                                                       dev_profile: Path) -> None:
    driver = tmp_path / "slow.py"
    driver.write_text("import os, time\nimport ray\nray.init()\n"
                      "restart = int(os.environ.get('SLURM_RESTART_COUNT', '0'))\n"
                      "print('driver started, restart', restart, flush=True)\n"
                      "if restart == 0:\n    time.sleep(300)\n"
                      "result = {'restart': restart, 'nodes': len([n for n in ray.nodes() if n['Alive']])}\n")
    spec = tmp_path / "ray.yaml"
    spec.write_text(yaml.safe_dump({"name": "ray-preempt", "ray": {"driver": "slow.py"},
                                    "resources": {"nodes": 2, "cpus_per_task": 1, "time": "00:10:00"}}))
    out = submit(str(spec), "-p", str(dev_profile))
    paths = RunPaths(Path(out["run_dir"]))
    log = paths.rank_log(out["job_id"], 0)
    wait_until(lambda: log.exists() and "driver started, restart 0" in log.read_text(), 120, "the driver to start",
               poll_s=0.5)
    # What Slurm does on preemption with --signal=B:USR2: signal the batch shell only.
    commands.run(["scancel", "--batch", "--signal=USR2", out["job_id"]])
    final = jobs.wait(paths, poller=steady(0.5), timeout_s=180)
    assert final.state == "COMPLETED"
    assert jobs.result(paths) == {"restart": 1, "nodes": 2}
    states = commands.incarnation_states(out["job_id"])
    assert len(states) == 2 and states[-1] == "COMPLETED", states
    # The batch shell asked the supervisor, the one decider, once the driver had recorded its stop.
    decisions = supervisor_events(paths.run_dir, "decision")
    assert [(d["action"], d["cause"]) for d in decisions] == [("requeue", "preemption")]
