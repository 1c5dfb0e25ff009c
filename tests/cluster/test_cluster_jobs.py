"""The submit path against the real dev cluster: slurmctld, slurmdbd and two slurmd nodes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import slurmkit
from slurmkit.cli.app import app
from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RunFile
from slurmkit.runs import jobs
from slurmkit.runs.lookup import list_runs
from slurmkit.runs.procs import pid_alive
from slurmkit.slurm import commands
from tests.conftest import ROOT, steady, supervisor_events, wait_until, write_spec
from tests.unit.test_command_stop import ranks_script_pid

pytestmark = pytest.mark.cluster
runner = CliRunner()


def submit(spec: Path, profile: Path, *sets: str) -> dict[str, str]:
    args = ["submit", str(spec), "-p", str(profile), "--json"]
    for s in sets:
        args += ["--set", s]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    data: dict[str, str] = json.loads(result.stdout)
    return data


def finish(run_dir: str, timeout_s: float = 120) -> jobs.RunStatus:
    st = jobs.wait(RunPaths(Path(run_dir)), poller=steady(0.5), timeout_s=timeout_s)
    assert not jobs.is_active(st.state), f"run still {st.state} after {timeout_s} s"
    return st


def wait_state(run_dir: str, state: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if jobs.run_state(RunPaths(Path(run_dir))).state == state:
            return
        time.sleep(0.3)
    raise AssertionError(f"run never reached {state}")


def test_callable_result_comes_back(cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    spec = write_spec(tmp_path, name="add", callable="tests.helpers_fns:add", kwargs={"a": 2, "b": 3})
    sub = submit(spec, dev_profile)
    assert sub["job_id"].isdigit() and Path(sub["run_dir"]).is_dir()
    assert finish(sub["run_dir"]).state == "COMPLETED"
    result = runner.invoke(app, ["result", sub["run_id"], "-p", str(dev_profile), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["sum"] == 5


def test_shell_command_result_and_record(cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    spec = write_spec(tmp_path, name="shell", command="echo out-$((6*7))")
    sub = submit(spec, dev_profile)
    finish(sub["run_dir"])
    value = jobs.result(RunPaths(Path(sub["run_dir"])))
    assert value == {"returncode": 0, "stdout": "out-42\n"}
    record = RunFile(RunPaths(Path(sub["run_dir"]))).read()
    assert record.job_ids == [sub["job_id"]]
    assert record.spec is not None and record.spec.command == "echo out-$((6*7))"
    assert record.profile.partition == "debug"
    # The raw Slurm job id names the run wherever a run id does.
    by_job = runner.invoke(app, ["result", sub["job_id"], "-p", str(dev_profile), "--json"])
    assert by_job.exit_code == 0 and json.loads(by_job.output)["stdout"] == "out-42\n", by_job.output
    status = runner.invoke(app, ["status", sub["job_id"], "-p", str(dev_profile), "--json"])
    assert [r["run_id"] for r in json.loads(status.output)] == [sub["run_id"]]


def test_after_any_and_after_notok_follow_a_failed_run(cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    failing = submit(write_spec(tmp_path, filename="f.yaml", name="fails", command="exit 3"), dev_profile)
    follower = write_spec(tmp_path, filename="g.yaml", name="follows", command="true")
    runs = {flag: submit_after(follower, dev_profile, flag, failing["run_id"])
            for flag in ("--after-any", "--after-notok", "--after")}
    assert finish(failing["run_dir"]).state == "FAILED"
    assert finish(runs["--after-any"]["run_dir"]).state == "COMPLETED"
    assert finish(runs["--after-notok"]["run_dir"]).state == "COMPLETED"
    # afterok on a failed job can never be met: Slurm says so, and the job never starts.
    after_ok = runs["--after"]["job_id"]
    wait_until(lambda: "DependencyNeverSatisfied" in commands.squeue_all()[after_ok].reason, 60,
               "Slurm to give up on the afterok dependency")
    commands.scancel([after_ok])


def submit_after(spec: Path, profile: Path, flag: str, ident: str) -> dict[str, str]:
    result = runner.invoke(app, ["submit", str(spec), "-p", str(profile), flag, ident, "--json"])
    assert result.exit_code == 0, result.output
    data: dict[str, str] = json.loads(result.stdout)
    script = (Path(data["run_dir"]) / "sbatch.sh").read_text()
    kind = {"--after": "afterok", "--after-any": "afterany", "--after-notok": "afternotok"}[flag]
    assert f"#SBATCH --dependency={kind}:" in script
    return data


def test_submitted_file_is_our_render(cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    """Fails if submitit stops calling _make_submission_file_text (the pinned private hook)."""
    spec = write_spec(tmp_path, name="hook", command="true")
    sub = submit(spec, dev_profile)
    paths = RunPaths(Path(sub["run_dir"]))
    submitted = (paths.job_folder / f"{sub['job_id']}_submission.sh").read_text()
    assert submitted.startswith("#!/bin/bash\n# Rendered by slurmkit")
    assert submitted == RunFile(paths).read().script == paths.script.read_text()
    assert "#SBATCH --signal=B:USR2@30" in submitted
    finish(sub["run_dir"])


def test_two_node_job_ranks_see_two_hostnames(cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    spec = write_spec(tmp_path, name="hosts", callable="tests.helpers_fns:add", kwargs={"a": 1, "b": 1},
                      resources={"nodes": 2})
    sub = submit(spec, dev_profile)
    assert finish(sub["run_dir"]).state == "COMPLETED"
    paths = RunPaths(Path(sub["run_dir"]))
    results = [jobs.result(paths, rank=r) for r in (0, 1)]
    assert [r["rank"] for r in results] == [0, 1]
    assert {r["host"] for r in results} == {"node1", "node2"}


def test_cancel(cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    spec = write_spec(tmp_path, name="long", callable="tests.helpers_fns:sleep", kwargs={"seconds": 120})
    sub = submit(spec, dev_profile)
    wait_state(sub["run_dir"], "RUNNING")
    result = runner.invoke(app, ["cancel", sub["run_id"], "-p", str(dev_profile)])
    assert result.exit_code == 0 and sub["job_id"] in result.output
    assert finish(sub["run_dir"], 60).state == "CANCELLED"
    failed = runner.invoke(app, ["result", sub["run_id"], "-p", str(dev_profile)])
    assert failed.exit_code == 4 and "CANCELLED" in failed.output


def test_failed_callable_result_shows_the_failing_log(cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    spec = write_spec(tmp_path, name="boom", callable="tests.helpers_fns:fail", kwargs={"message": "kaboom-17"})
    sub = submit(spec, dev_profile)
    finish(sub["run_dir"])
    result = runner.invoke(app, ["result", sub["run_id"], "-p", str(dev_profile)])
    assert result.exit_code == 4
    assert "kaboom-17" in result.output and "rank 0" in result.output


def test_logs_prefix_ranks_and_follow_ends_by_itself(cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    spec = write_spec(tmp_path, name="logs", command="for i in 1 2 3; do echo tick-$i; sleep 1; done; echo last",
                      resources={"nodes": 2})
    sub = submit(spec, dev_profile)
    proc = subprocess.run([sys.executable, "-m", "slurmkit", "logs", sub["run_id"], "-p", str(dev_profile),
                           "--follow"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "[0] last" in proc.stdout.splitlines() and "[1] last" in proc.stdout.splitlines()
    assert "[1] tick-2" in proc.stdout.splitlines()
    only1 = runner.invoke(app, ["logs", sub["run_id"], "-p", str(dev_profile), "--rank", "1"])
    assert "[1] last" in only1.output and "[0]" not in only1.output


def test_status_of_many_runs_is_one_squeue_call(cluster: None, tmp_path: Path, dev_profile: Path,
                                                run_root: Path) -> None:
    spec = write_spec(tmp_path, name="many", command="sleep 1")
    subs = [submit(spec, dev_profile) for _ in range(4)]
    with commands.counting() as calls:
        result = runner.invoke(app, ["status", "-p", str(dev_profile), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert {r["job_id"] for r in rows} == {s["job_id"] for s in subs}
    assert calls["squeue"] == 1 and calls["sacct"] <= 1 and calls.total() <= 2
    for s in subs:
        finish(s["run_dir"])
    listed = json.loads(runner.invoke(app, ["list", "-p", str(dev_profile), "--json"]).output)
    assert [r["run_id"] for r in listed] == [p.run_id for p in list_runs(str(run_root))]
    assert {r["state"] for r in listed} == {"COMPLETED"}


@pytest.mark.parametrize(
    ("sets", "fragment"),
    [
        (["profile.partition=nosuch"], "partition 'nosuch' does not exist on this cluster valid: debug"),
        (["resources.time=02:00:00"], "time 02:00:00 exceeds partition 'debug' MaxTime=01:00:00"),
        (["resources.nodes=3"], "nodes=3 exceeds the 2 nodes of partition 'debug'"),
        (["resources.gpus_per_node=1"], "gpus_per_node=1 but partition 'debug' has no GRES gpu"),
    ],
)
def test_preflight_refusals(cluster: None, tmp_path: Path, dev_profile: Path, run_root: Path,
                            sets: list[str], fragment: str) -> None:
    spec = write_spec(tmp_path, name="pre", command="true")
    args = ["submit", str(spec), "-p", str(dev_profile)] + [a for s in sets for a in ("--set", s)]
    with commands.counting() as calls:
        result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert fragment in result.output and len(result.output.strip().splitlines()) == 1
    assert calls["sbatch"] == 0 and calls.total() > 0  # pre-flight asked the cluster, then refused
    assert list(run_root.iterdir()) == []


def test_preflight_refuses_array_over_max_array_size(cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    from slurmkit.errors import PreflightError
    from slurmkit.load.loader import resolve
    from slurmkit.slurm import preflight

    res = resolve(write_spec(tmp_path, name="arr", command="true"), str(dev_profile))
    assert preflight.check(res, array_size=1001) == "debug"
    with pytest.raises(PreflightError, match="array of 1002 tasks exceeds MaxArraySize=1001"):
        preflight.check(res, array_size=1002)


@pytest.fixture
def qos_one_node_twenty_minutes(cluster: None) -> Any:
    """The dev cluster's QOS `normal` with limits a site sets (one node per job, 20 minutes), put back after."""
    commands.run(["sacctmgr", "-i", "modify", "qos", "normal", "set", "MaxTRESPerJob=node=1", "MaxWall=00:20:00"])
    try:
        yield
    finally:
        commands.run(["sacctmgr", "-i", "modify", "qos", "normal", "set", "MaxTRESPerJob=node=-1", "MaxWall=-1"])


def test_preflight_refuses_what_the_qos_would_keep_pending_forever(qos_one_node_twenty_minutes: None,
                                                                   tmp_path: Path, dev_profile: Path) -> None:
    """QOSMaxNodePerJobLimit and QOSMaxWallDurationPerJobLimit: Slurm would queue such a job and never
    start it; pre-flight reads the association's QOS (sacctmgr) and refuses it in one line instead."""
    from slurmkit.errors import PreflightError
    from slurmkit.insight import doctor
    from slurmkit.load.loader import resolve
    from slurmkit.slurm import limits, preflight

    def resolved(nodes: int, limit: str) -> Any:
        spec = write_spec(tmp_path, name="qos", command="true", resources={"nodes": nodes, "time": limit})
        return resolve(spec, str(dev_profile))

    for nodes, limit, where in ((2, "00:10:00", "resources.nodes"), (1, "00:30:00", "resources.time")):
        with pytest.raises(PreflightError) as refused:
            preflight.check(resolved(nodes, limit))
        assert refused.value.where == where
    fits = resolved(1, "00:10:00")
    assert preflight.check(fits) == "debug"
    qos = limits.check(fits)
    assert qos is not None and (qos.name, qos.per_job, qos.max_wall) == ("normal", {"node": 1}, "00:20:00")
    share = doctor._share(fits)
    assert share.status == doctor.PASS and limits.fairshare("root") is not None


def test_dry_run_touches_no_slurm_daemon(cluster: None, tmp_path: Path, dev_profile: Path, run_root: Path) -> None:
    spec = write_spec(tmp_path, name="dry", command="true")
    with commands.counting() as calls:
        result = runner.invoke(app, ["submit", str(spec), "-p", str(dev_profile), "--dry-run"])
    assert result.exit_code == 0 and "#SBATCH --partition=debug" in result.output
    assert calls.total() == 0
    assert list(run_root.iterdir()) == []


def test_sbatch_refusal_leaves_no_run_record(cluster: None, tmp_path: Path, dev_profile: Path,
                                             run_root: Path) -> None:
    spec = write_spec(tmp_path, name="rej", command="true")
    result = runner.invoke(app, ["submit", str(spec), "-p", str(dev_profile),
                                 "--set", "profile.sbatch_extra=[--licenses=bogus:1]"])
    assert result.exit_code == 3, result.output
    assert "submission failed" in result.output and "Traceback" not in result.output
    assert list(run_root.iterdir()) == []


def test_submit_while_slurmctld_is_down(cluster: None, tmp_path: Path, dev_profile: Path, run_root: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmkit.devcluster import cluster as dc

    # One attempt: each scontrol spends about 9 s in its own connect retries against a dead
    # controller. The query retries themselves are tested in test_polling.py (stand-in squeue).
    monkeypatch.setattr(commands, "QUERY_ATTEMPTS", 1)

    pid = dc.status()["daemons"]["slurmctld"]["pid"]
    os.kill(pid, signal.SIGTERM)
    try:
        deadline = time.monotonic() + 20
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        spec = write_spec(tmp_path, name="down", command="true")
        result = runner.invoke(app, ["submit", str(spec), "-p", str(dev_profile)])
        assert result.exit_code == 3, result.output
        assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
        assert list(run_root.iterdir()) == []
    finally:
        dc.up(2, log=lambda m: None)
    assert commands.ping()["up"]


def test_sacct_reports_finished_jobs_in_one_call(cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    spec = write_spec(tmp_path, name="acct", command="true")
    subs = [submit(spec, dev_profile) for _ in range(2)]
    for s in subs:
        finish(s["run_dir"])
    ids = [s["job_id"] for s in subs]
    deadline = time.monotonic() + 30
    infos: dict[str, commands.JobInfo] = {}
    while time.monotonic() < deadline:  # slurmdbd records the end a moment after squeue shows it
        with commands.counting() as calls:
            infos = commands.sacct(ids)
        if all(infos.get(i) and infos[i].state == "COMPLETED" for i in ids):
            break
        time.sleep(0.5)
    assert calls == {"sacct": 1}
    assert {i: infos[i].state for i in ids} == dict.fromkeys(ids, "COMPLETED")
    assert all(infos[i].restarts == 0 and infos[i].exit_code == "0:0" for i in ids)


def test_the_dry_run_is_the_very_request_submit_sends(cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    """As TorchX's dry run: one typed value, shown, then sent as it is (the run id and folder it
    names included), byte for byte what sbatch got."""
    from slurmkit.load.loader import resolve
    resolved = resolve(write_spec(tmp_path, name="same", command="true", resources={"nodes": 1}), str(dev_profile))
    request = jobs.dry_run(resolved)
    assert str(request.run_paths.job_folder) in request.script
    sub = jobs.send(request)
    paths = request.run_paths
    assert (sub.run_id, sub.run_dir, sub.script) == (paths.run_id, str(paths.run_dir), request.script)
    assert RunPaths(Path(sub.run_dir)).script.read_text() == request.script
    assert finish(sub.run_dir, timeout_s=120).state == "COMPLETED"


@pytest.mark.parametrize("kind", ["command", "callable"])
def test_preemption_signal_requeues_a_run_without_steps(cluster: None, tmp_path: Path, dev_profile: Path,
                                                        kind: str) -> None:
    # The first incarnation blocks; the requeued one (SLURM_RESTART_COUNT=1) finishes at once.
    fields: dict[str, Any] = (
        {"command": 'echo "started $SLURM_RESTART_COUNT"; [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] || sleep 300; '
                    'echo "done $SLURM_RESTART_COUNT"'}
        if kind == "command" else {"callable": "tests.helpers_fns:sleep_unless_restarted"})
    spec = write_spec(tmp_path, name=f"pre-{kind}", resources={"nodes": 1, "time": "00:05:00"}, **fields)
    sub = submit(spec, dev_profile)
    paths = RunPaths(Path(sub["run_dir"]))
    log = paths.rank_log(sub["job_id"], 0)
    wait_until(lambda: log.exists() and "started" in log.read_text(), 60, "the run to start", poll_s=0.3)
    # Slurm's preemption warning with --signal=B:USR2: the batch shell only; it forwards to the ranks.
    commands.run(["scancel", "--batch", "--signal=USR2", sub["job_id"]])
    st = finish(sub["run_dir"], timeout_s=120)
    assert st.state == "COMPLETED"
    value = jobs.result(paths)
    assert (value["stdout"].split()[-2:] == ["done", "1"]) if kind == "command" else value == {"restarts": 1}
    record = RunFile(paths).read()
    assert [r.cause for r in record.restarts] == ["preemption"]
    # The supervisor decided and requeued (rank 0 only recorded the stop), once, in the first incarnation.
    decisions = supervisor_events(paths.run_dir, "decision")
    assert [(d["action"], d["cause"], d["restart_count"]) for d in decisions] == [("requeue", "preemption", 0)]


USER_DDP = Path(__file__).parents[1] / "user_code" / "ddp_toy.py"


def _ddp_lines(world: int, per_node: int, steps: int) -> list[str]:
    return [f"rank={r} world={world} local={r % per_node} steps={steps} weights_equal=True" for r in range(world)]


@pytest.mark.parametrize("launcher, per_node", [("srun", 1), ("torchrun", 2)])
def test_a_users_own_ddp_script_runs_unmodified_as_a_command(cluster: None, tmp_path: Path, dev_profile: Path,
                                                             launcher: str, per_node: int) -> None:
    """tests/user_code/ddp_toy.py, which knows nothing of slurmkit, trains DDP on 2 nodes with a plain
    init_process_group(): its ranks started by srun, or by one torchrun a node (c10d rendezvous on the
    first). `python` in the command is the ranks' own interpreter, whatever the batch shell's PATH says."""
    spec = write_spec(tmp_path, name="own", command=f"python {USER_DDP} --steps 4",
                      resources={"nodes": 2, "tasks_per_node": per_node, "time": "00:05:00"})
    sub = submit(spec, dev_profile, f"launcher={launcher}")
    assert finish(sub["run_dir"], timeout_s=180).state == "COMPLETED"
    world = 2 * per_node
    outs = [jobs.result(RunPaths(Path(sub["run_dir"])), rank=r)["stdout"].strip().splitlines()[-1]
            for r in range(world)]
    assert outs == _ddp_lines(world, per_node, 4)


def test_a_users_own_ddp_script_from_the_python_api(cluster: None, dev_profile: Path) -> None:
    job = slurmkit.Executor(profile=str(dev_profile), nodes=2, time="00:05:00").submit_command(
        ["python", str(USER_DDP), "--steps", "3"])
    outs = job.results(timeout=180)
    assert [o["stdout"].strip().splitlines()[-1] for o in outs] == _ddp_lines(2, 1, 3)


RESUMABLE = Path(__file__).parents[1] / "user_code" / "ddp_toy_resumable.py"
RESUMABLE_STEPS = 80


def _rank0_steps(paths: RunPaths, job_id: str) -> list[int]:
    """Every step rank 0 of the user's script ran, in order, over every incarnation and in-job attempt.
    Not anchored at line starts: a torchrun's ranks share their node's log, and a rank's line may
    begin where another's has not yet ended (print writes the text and its newline apart)."""
    return [int(n) for n in re.findall(r"rank=0 step=(\d+) ", paths.rank_log(job_id, 0).read_text())]


def _checksums(text: str) -> list[str]:
    return re.findall(r"rank=\d+ checksum=([-+.\deE]+|nan)", text)


@pytest.fixture(scope="module")
def uninterrupted_checksums(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], list[str]]:
    """The same script, never stopped, on `world` local ranks: the final weights to match bit for bit.
    Run once a world size for the module: the torchrun cases share theirs."""
    root = tmp_path_factory.mktemp("reference")
    profile = write_spec(root, filename="loc.yaml", extends="local", run_root=str(root / "runs"))
    found: dict[int, list[str]] = {}

    def checksums(world: int) -> list[str]:
        if world not in found:
            job = slurmkit.Executor(profile=str(profile), tasks_per_node=world, name="reference").submit_command(
                ["python", str(RESUMABLE), "--steps", str(RESUMABLE_STEPS)])
            found[world] = [c for out in job.results(timeout=300) for c in _checksums(out["stdout"])]
        return found[world]

    return checksums


@pytest.mark.parametrize("launcher, per_node, world", [("srun", 1, 2), ("torchrun", 2, 4)])
def test_a_users_script_with_a_checkpoint_preempted_loses_no_step(
        cluster: None, tmp_path: Path, dev_profile: Path, uninterrupted_checksums: Callable[[int], list[str]],
        launcher: str, per_node: int, world: int) -> None:
    """tests/user_code/ddp_toy_resumable.py (the user's DDP script plus ten lines) as a command on 2
    nodes: its ranks started by srun, or by slurmkit's torchrun a node (`launcher: torchrun`).
    Preempted, its ranks stop at one agreed step and save it, the requeued job goes on from there,
    and the final weights equal an uninterrupted run's. Under srun, a kill -9 of rank 1's script
    after that is restarted in the job from the last commit. (A launcher of the user's own in the
    command, which must not die of the signal under its ranks' save: accelerate's multi-node launch,
    torch's elastic launcher underneath, in tests/cluster/test_cluster_frameworks.py.)"""
    script = f"{RESUMABLE} --steps {RESUMABLE_STEPS} --step-time 0.1"
    spec = write_spec(tmp_path, name="resumable", resources={"nodes": 2, "tasks_per_node": per_node,
                                                             "time": "00:10:00"}, command=f"python {script}")
    sub = submit(spec, dev_profile, f"launcher={launcher}")
    paths, job_id = RunPaths(Path(sub["run_dir"])), sub["job_id"]
    log = paths.rank_log(job_id, 0)
    wait_until(lambda: log.exists() and len(_rank0_steps(paths, job_id)) >= 20, 120, "step 20", poll_s=0.2)
    commands.run(["scancel", "--batch", "--signal=USR2", job_id])  # the supervisor passes it on to the ranks
    stopped = len(_rank0_steps(paths, job_id))
    wait_until(lambda: len(RunFile(paths).read().restarts) == 1 and len(_rank0_steps(paths, job_id)) > stopped + 1
               or not jobs.is_active(jobs.run_state(paths).state), 240, "the resumed run stepping", poll_s=0.2)
    killed = None
    if launcher == "srun":
        pid = ranks_script_pid(paths.command_stop(job_id, 1))  # found first: a /proc scan takes a while here
        assert pid is not None
        wait_until(lambda: len(_rank0_steps(paths, job_id)) >= 45, 60, "step 45", poll_s=0.1)
        killed = _rank0_steps(paths, job_id)[-1]
        os.kill(pid, signal.SIGKILL)
    assert finish(sub["run_dir"], timeout_s=300).state == "COMPLETED"
    record = RunFile(paths).read()
    assert [(r.kind, r.cause) for r in record.restarts] == [("requeue", "preemption")] + (
        [("in_job", "crash")] if killed else []), [(r.detail, r.step) for r in record.restarts]
    done = _rank0_steps(paths, job_id)
    before_kill = done[:done.index(killed) + 1] if killed else done
    assert before_kill == list(range(1, len(before_kill) + 1))  # preempted: no step lost, none run twice
    assert sorted(set(done)) == list(range(1, RESUMABLE_STEPS + 1))
    out = "\n".join(paths.rank_log(job_id, r).read_text() for r in range(2 * per_node))  # Slurm's ranks' logs
    assert sorted(_checksums(out)) == sorted(uninterrupted_checksums(world))  # one a rank, at its end


def test_submit_wait_shows_the_pending_reason_and_each_transition(cluster: None, tmp_path: Path,
                                                                  dev_profile: Path) -> None:
    spec = write_spec(tmp_path, name="held", command="echo released",
                      resources={"nodes": 1, "tasks_per_node": 1, "time": "00:05:00"})
    proc = subprocess.Popen([sys.executable, "-m", "slurmkit", "submit", str(spec), "-p", str(dev_profile),
                             "--set", "profile.sbatch_extra=[--hold]", "--wait"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None and proc.stdout is not None
    lines = []
    for line in proc.stderr:  # transitions arrive as they happen, one line each
        lines.append(line.strip())
        if "PENDING (JobHeldUser)" in line:
            break
    job_id = proc.stdout.readline().split("job ")[1].split()[0]
    status = runner.invoke(app, ["status", job_id, "-p", str(dev_profile), "--json"])
    assert json.loads(status.stdout)[0]["reason"] == "JobHeldUser"  # `status` shows the pending reason too
    subprocess.run(["scontrol", "release", job_id], check=True)
    out, err = proc.communicate(timeout=120)
    lines += [ln.strip() for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 0 and "COMPLETED" in out and "released" in out
    states = [ln.split(" ", 1)[1] for ln in lines]  # each line: HH:MM:SS STATE
    assert states[0] == "PENDING (JobHeldUser)" and states[-1] == "COMPLETED"
    assert all(a != b for a, b in zip(states, states[1:], strict=False))  # a line per change, not per poll


def test_srun_args_reach_the_ranks_step_and_sbatch_args_the_job(cluster: None, tmp_path: Path,
                                                                 dev_profile: Path) -> None:
    spec = write_spec(tmp_path, name="extra", command="echo in-step", srun_args=["--job-name=sk-srun-args"],
                      sbatch_args={"comment": "sk-sbatch-args", "mail_type": "NONE"})
    sub = submit(spec, dev_profile)
    finish(sub["run_dir"])
    shown = subprocess.run(["scontrol", "show", "job", sub["job_id"]], capture_output=True, text=True, check=True,
                           timeout=30).stdout
    assert "Comment=sk-sbatch-args" in shown.split()
    steps = subprocess.run(["sacct", "-j", sub["job_id"], "-n", "-P", "--format=JobID,JobName"], capture_output=True,
                           text=True, check=True, timeout=30).stdout.split()
    assert f"{sub['job_id']}.0|sk-srun-args" in steps  # the ranks' step, named by srun_args
