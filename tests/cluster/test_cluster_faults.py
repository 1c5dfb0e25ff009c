"""Fault injection on the real dev cluster: every run must complete with the digest of an
uninterrupted run, losing at most one checkpoint interval of steps."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurmkit.common.cause import Cause
from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import StartupWatched, Stragglers
from slurmkit.common.metrics import iter_records, read_records
from slurmkit.common.node_ledger import NodeLedger
from slurmkit.common.record import RunFile
from slurmkit.devcluster import names, ranks
from slurmkit.load.loader import resolve
from slurmkit.runs import jobs, tracker_upload
from slurmkit.runs import logs as run_logs
from slurmkit.runs.failure import failure
from slurmkit.worker.checkpoint import sharded
from slurmkit.worker.checkpoint.store import CheckpointStore
from tests import sshd
from tests.conftest import EXAMPLES, executed_steps, slow_down, steady, supervisor_events, wait_until, write_dev_profile

pytestmark = pytest.mark.cluster
EVERY = 50
STEPS = 200  # the faults land at steps 60-110, at least 90 steps (about 4 s) before the end
# Batch 8 rather than the example's 16: the assertions are about steps, and a cheaper step keeps
# these nine tests (each at least one requeue) from being most of the suite's time.
SETS = ["resources.nodes=2", "resources.tasks_per_node=1", f"config.steps={STEPS}", "config.batch_size=8",
        f"config.checkpoint_every={EVERY}", "config.log_every=50", "config.seed=11"]


# A metrics record every 5 steps, for tests that signal a rank at a step: the signal lands where it
# is aimed, not at the next record (one a second by default: near step 100, its save in flight).
FINE_LOG = ("config.log_every=5", "config.log_min_interval_s=0")
# |final - uninterrupted| / |uninterrupted| per tensor after an elastic shrink: 1.5e-3 measured (Adam
# amplifies the summation-order noise over 125 steps), docs/fault-tolerance.md "Elastic runs".
ELASTIC_DRIFT = 1e-2


def start(profile: Path, *extra: str) -> tuple[RunPaths, str]:
    sub = jobs.submit(resolve(EXAMPLES / "train_gpt.yaml", str(profile), [*SETS, *extra]))
    assert sub.job_id
    return RunPaths(Path(sub.run_dir)), sub.job_id


def steps_done(paths: RunPaths) -> list[int]:
    try:
        # Only whole lines: the last one may be half written while the rank appends it.
        return [json.loads(ln)["step"] for ln in paths.metrics.read_text().split("\n")[:-1] if ln.strip()]
    except FileNotFoundError:
        return []


def wait_step(paths: RunPaths, step: int) -> None:
    wait_until(lambda: (steps_done(paths) or [0])[-1] >= step, what=f"step {step}")


def rank_pid(paths: RunPaths, rank: int) -> int:
    try:
        return ranks.rank_pid(paths, rank)
    except LookupError as exc:
        raise AssertionError(str(exc)) from None


def signal_rank_at_step(paths: RunPaths, rank: int, step: int, sig: int) -> None:
    """Signal one rank right after `step`: its pid is found first (a /proc scan takes a while here),
    so the signal lands at the step, not dozens of steps later next to a checkpoint in flight."""
    wait_step(paths, 1)
    pid = rank_pid(paths, rank)
    wait_step(paths, step)
    os.kill(pid, sig)


def finish(paths: RunPaths, timeout_s: float = 240) -> str:
    return jobs.wait(paths, poller=steady(1.0), timeout_s=timeout_s).state


def check(paths: RunPaths, reference: dict[str, Any], max_lost: int = EVERY) -> dict[str, Any]:
    assert finish(paths) == "COMPLETED", failure(paths, RunFile(paths).read().job_ids[-1]).log_tail
    results = [jobs.result(paths, rank=r) for r in (0, 1)]
    assert results[0]["params_sha256"] == results[1]["params_sha256"] == reference["params_sha256"]
    lost = len(executed_steps(paths.metrics)) - STEPS
    assert 0 <= lost <= max_lost, f"{lost} steps recomputed"
    assert results[0]["restarts"] >= 1
    assert Stragglers.read(paths) == []  # no rank was slowed: none is named
    return results[0]


def uninterrupted(tmp_path_factory: pytest.TempPathFactory, *extra: str) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("ref")
    paths, _ = start(write_dev_profile(root / "p.yaml", root / "runs"), *extra)
    assert finish(paths) == "COMPLETED"
    result: dict[str, Any] = jobs.result(paths)
    assert result["restarts"] == 0 and executed_steps(paths.metrics) == list(range(1, STEPS + 1))
    return {**result, "checkpoints": paths.checkpoints}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The DDP run, uninterrupted, under srun."""
    return uninterrupted(tmp_path_factory)


FSDP = "config.parallel=fsdp"


@pytest.fixture(scope="module")
def fsdp_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same run under FSDP2 (sharded DCP checkpoints), uninterrupted, under srun."""
    return uninterrupted(tmp_path_factory, FSDP)


@pytest.fixture(scope="module")
def laptop(login_host: sshd.Sshd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[sshd.Laptop]:
    """Another unix user with its own Python (no torch), driving the cluster over one SSH connection."""
    with sshd.laptop(login_host, "sklaptop2", tmp_path_factory.mktemp("wheel")) as user:
        yield user


def the_run(run_root: Path) -> RunPaths | None:
    """The one run under run_root, once its run.json is written."""
    found = [p for p in run_root.iterdir() if (p / "run.json").exists()] if run_root.exists() else []
    return RunPaths(found[0]) if found else None


def test_preemption_signal_on_a_run_from_a_laptop_saves_at_the_step_resumes_and_reports_both_segments(
        cluster: None, laptop: sshd.Laptop, login_host: sshd.Sshd, run_root: Path,
        reference: dict[str, Any]) -> None:
    """Submitted from a laptop with --wait (docs/remote.md), preempted on the cluster's side: the wait
    ends COMPLETED, and the run is the preemption case and the observability case."""
    site = laptop.profile("dev-site", login_host, extends="devcluster", run_root=str(run_root))
    spec = laptop.write("work/gpt.yaml", (EXAMPLES / "train_gpt.yaml").read_text())
    before = login_host.accepted()
    sets = [a for s in SETS for a in ("--set", s)]
    waiter = subprocess.Popen(laptop.argv("submit", str(spec), "-p", str(site), *sets, "--wait", "--json"),
                              cwd=laptop.home, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: the_run(run_root) is not None, 120, "the run folder")
    paths = the_run(run_root)
    assert paths is not None
    wait_step(paths, 60)
    job = jobs.run_state(paths).job_id
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    out, err = waiter.communicate(timeout=600)
    assert waiter.returncode == 0, err
    assert json.loads(out)["state"] == "COMPLETED"
    result = check(paths, reference, max_lost=0)  # the final save is at the stop step
    assert result["restart_causes"] == ["preemption"]
    # Checkpoints the ranks wrote, in both incarnations, under the job's umask: never world-readable.
    written = list(paths.checkpoints.rglob("*"))
    assert any(p.name == "model.pt" for p in written)
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in written), [
        (p, oct(p.stat().st_mode)) for p in written]
    # The same run is the observability case (docs/observability.md): its report, drawn on the login
    # host and brought back to the laptop, shows both job segments, the restart's start-up phases
    # and the goodput (one preempted run serves all three).
    png = laptop.home / "work" / "report.png"
    rep = laptop.slurmkit("report", paths.run_id, "-p", str(site), "-o", str(png), "--json")
    assert rep.returncode == 0, rep.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    status = laptop.slurmkit("status", paths.run_id, "-p", str(site), "--json")
    assert status.returncode == 0, status.stderr
    html = laptop.home / "work" / "report.html"
    assert laptop.slurmkit("report", paths.run_id, "-p", str(site), "-o", str(html)).returncode == 0
    check_report_of_a_run_preempted_once(paths, job, json.loads(rep.stdout), json.loads(status.stdout)[0],
                                         html.read_text())
    assert login_host.accepted() - before == 1  # the submit opened the connection; the rest reused it


def check_report_of_a_run_preempted_once(paths: RunPaths, job_id: str, info: dict[str, Any],
                                         status: dict[str, Any], html: str) -> None:
    assert info["incarnations"] == 2 and info["restart_causes"] == ["preemption"]
    from slurmkit.insight import report

    data = report.collect(paths)
    first, second = data.segments
    assert first.job_id == second.job_id == job_id and first.cause == "preemption"
    assert first.end is not None and second.start is not None and second.start >= first.end
    # Where the restart's seconds went, from the resumed first step's record.
    assert list(second.startup) == ["launch", "imports", "rendezvous", "build", "restore", "first_step"]
    assert all(v >= 0 for v in second.startup.values()) and second.startup["imports"] > 0
    assert info["startup_s"][1] == second.startup
    gp = data.accounting
    assert 0 < gp.goodput < 1 and gp.steps == STEPS
    assert gp.productive_s < gp.wall_s and gp.queue_wait_s > 0
    assert status["restarts"] == 1 and status["goodput"] == pytest.approx(gp.goodput, abs=0.05)
    # What it cost: sacct's own elapsed seconds times nodes, both incarnations summed; a CPU run: no GPU-hours.
    rows = subprocess.run(["sacct", "-X", "-n", "-P", "--duplicates", "-j", job_id, "-o", "ElapsedRaw,NNodes"],
                          check=True, capture_output=True, text=True).stdout.split()
    node_s = sum(int(e) * int(n) for e, n in (row.split("|") for row in rows))
    assert len(rows) == 2 and status["node_hours"] == pytest.approx(node_s / 3600, abs=1e-3)
    assert status["gpu_hours"] == 0 and 0 < status["lost_node_hours"] < status["node_hours"]
    assert info["cost"]["node_hours"] == pytest.approx(status["node_hours"], abs=1e-3)
    # The HTML page carries its panels' data (report_html): the restart and both incarnations came back
    page = json.loads(html.split("<script type='application/json' id='report-data'>", 1)[1].split("</script>", 1)[0])
    assert [cause for _, cause in page["restarts"]] == ["preemption"] and len(page["segments"]) == 2


def test_scontrol_requeue_resumes_bitwise_from_checkpoints_on_s3_in_one_tracker_run(
        cluster: None, dev_profile: Path, reference: dict[str, Any], tmp_path: Path) -> None:
    """An external `scontrol requeue` of a run whose checkpoint_root is an S3 server
    (tests/s3_server.py) that the nodes reach over the dev cluster's private network, with the
    credentials and endpoint in the run's env: the stop's save goes there, the requeued job restores
    from it, the weights equal an uninterrupted run's, and both incarnations are one tracker run."""
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from slurmkit.devcluster.names import CONTROLLER_IP
    from tests.s3_server import BUCKET, serving

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with serving(CONTROLLER_IP) as s3:
        paths, job = start(dev_profile, "tracking.tensorboard=true", f"tracking.mlflow={uri}",
                           f"profile.checkpoint_root=s3://{BUCKET}/runs", *(f"env.{k}={v}" for k, v in s3.env.items()))
        wait_step(paths, 75)
        subprocess.run(["scontrol", "requeue", job], check=True)
        # Slurm's SIGTERM comes KillWait seconds before SIGKILL: the ranks save at the step they are at.
        result = check(paths, reference, max_lost=0)
        committed = sorted(p.rsplit("/", 2)[-2] for p in s3.fs().find(f"{BUCKET}/runs/{paths.run_id}")
                           if p.endswith("/COMMITTED.json"))
    assert f"step-{STEPS}" in committed and len(committed) >= 2  # the stop's save and the final one, on S3
    assert not paths.checkpoints.exists()  # nothing went to the run folder instead
    assert result["restart_causes"] == ["requeue"]
    assert "SIGTERM: stopped at step" in "\n".join(run_logs.logs(paths, rank=0))
    # Both incarnations in one tracker run (docs/tracking.md): every step once, the requeue an event
    # at the step the second resumed from.
    (restart,) = RunFile(paths).read().restarts
    steps = sorted(r["step"] for r in read_records(paths.metrics))
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("train-gpt").experiment_id])  # type: ignore[union-attr]
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "loss")) == steps
    assert [m.step for m in client.get_metric_history(run.info.run_id, "slurmkit/restart")] == [restart.resumed_step]
    assert run.info.status == "FINISHED"
    events = EventAccumulator(str(paths.tensorboard))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == steps
    assert [e.step for e in events.Scalars("slurmkit/restart")] == [restart.resumed_step]
    # `slurmkit track`: the goodput accounting sacct gives (as status shows it) joins the same run
    sent = tracker_upload.track(paths).accounting
    assert sent is not None and sent["goodput"] == jobs.run_state(paths).goodput
    assert RunFile(paths).read().goodput is None  # status reads only: nothing cached in run.json
    run = client.get_run(run.info.run_id)
    assert run.data.metrics["final.goodput"] == pytest.approx(sent["goodput"])


def test_scancel_saves_at_the_step_and_ends_cancelled(cluster: None, dev_profile: Path) -> None:
    paths, job = start(dev_profile)
    wait_step(paths, 60)
    subprocess.run(["scancel", job], check=True)
    assert finish(paths) == "CANCELLED"
    saved = re.findall(r"SIGTERM: stopped at step (\d+)", "\n".join(run_logs.logs(paths, rank=0)))
    assert len(saved) == 1, "no final save after scancel's SIGTERM"
    store = CheckpointStore(str(paths.checkpoints))
    assert store.latest_valid() == int(saved[0]) >= 60  # the step the ranks agreed on, committed
    assert not RunFile(paths).read().restarts  # cancelled: Slurm does not bring it back


def check_with_node2_down_at_75(paths: RunPaths, reference: dict[str, Any]) -> dict[str, Any]:
    """node2 set DOWN at step 75 (ReturnToService brings it back); the run's checked result."""
    wait_step(paths, 75)
    try:
        subprocess.run(["scontrol", "update", "NodeName=node2", "State=DOWN", "Reason=fault-test"], check=True)
        return check(paths, reference)
    finally:
        subprocess.run(["scontrol", "update", "NodeName=node2", "State=RESUME"], check=False, capture_output=True)


def test_node_down_mid_run(cluster: None, dev_profile: Path, reference: dict[str, Any]) -> None:
    paths, job = start(dev_profile)
    result = check_with_node2_down_at_75(paths, reference)
    assert result["restart_causes"] == ["node_failure"]


@pytest.fixture
def three_nodes(cluster: None) -> Iterator[None]:
    """The dev cluster with a third node, for a 2-node run with one spare; back to two after."""
    from slurmkit.devcluster import cluster as dc

    dc.up(3, log=lambda _: None)
    try:
        yield
    finally:
        dc.up(2, log=lambda _: None)


def step_nodes(job: str) -> dict[str, str]:
    """Each srun step of a job and the nodes it ran on, as accounting saw them."""
    out = subprocess.run(["sacct", "-j", job, "--noheader", "--parsable2", "--format=JobID,NodeList"],
                         capture_output=True, text=True, check=True).stdout
    rows = [line.split("|") for line in out.splitlines()]
    return {r[0]: r[1] for r in rows if len(r) > 1 and r[0].rpartition(".")[2].isdigit() and "." in r[0]}


def test_a_node_set_down_with_a_spare_continues_on_the_spare_without_a_requeue(
        three_nodes: None, dev_profile: Path, reference: dict[str, Any]) -> None:
    paths, job = start(dev_profile, "resources.spare_nodes=1", *FINE_LOG)
    result = check_with_node2_down_at_75(paths, reference)
    assert result["restart_causes"] == ["node_failure"] and result["in_job_restarts"] == 1
    (entry,) = RunFile(paths).read().restarts
    assert (entry.in_job, entry.nodes_lost, entry.exclude) == (1, ["node2"], [])
    assert incarnations(job) == ["COMPLETED"]  # no requeue: one incarnation in sacct
    assert step_nodes(job) == {f"{job}.0": "node[1-2]", f"{job}.1": "node[1,3]"}  # the spare took node2's rank


def test_a_node_set_down_in_an_elastic_fsdp_run_goes_on_resharded_with_the_node_left_and_the_same_global_batch(
        cluster: None, dev_profile: Path, fsdp_reference: dict[str, Any]) -> None:
    """No spare: with resources.elastic the job keeps node1 (--no-kill) and the ranks start again on
    it alone, one rank taking the whole global batch of 8. Under FSDP2 the 2-rank shards of the last
    checkpoint reshard into the one rank's whole state (DDP's shrink goes the same way, unsharded)."""
    paths, job = start(dev_profile, FSDP, "resources.elastic=true", *FINE_LOG)
    wait_step(paths, 75)
    try:
        subprocess.run(["scontrol", "update", "NodeName=node2", "State=DOWN", "Reason=fault-test"], check=True)
        assert finish(paths) == "COMPLETED", failure(paths, job).log_tail
    finally:
        subprocess.run(["scontrol", "update", "NodeName=node2", "State=RESUME"], check=False, capture_output=True)
    result = jobs.result(paths)
    assert (result["world_size"], result["global_batch"]) == (1, fsdp_reference["global_batch"]) == (1, 8)
    (entry,) = RunFile(paths).read().restarts
    assert (entry.cause, entry.in_job, entry.nodes_lost, entry.nodes) == ("node_failure", 1, ["node2"], 1)
    assert entry.resumed_step is not None and entry.resumed_step >= EVERY  # from the 2-rank shards
    assert incarnations(job) == ["COMPLETED"]  # no requeue
    assert step_nodes(job) == {f"{job}.0": "node[1-2]", f"{job}.1": "node1"}
    # The same samples each step, their gradients summed in another order: close, not bitwise.
    assert len(executed_steps(paths.metrics)) - STEPS <= EVERY
    final, ref = (sharded.full_state(CheckpointStore(str(c)), STEPS)
                  for c in (paths.checkpoints, fsdp_reference["checkpoints"]))
    weights = [name for name in ref if name.startswith("model.")]
    assert weights and set(weights) <= set(final)
    drift = {name: float((final[name] - ref[name]).norm() / ref[name].norm().clamp_min(1e-12)) for name in weights}
    assert max(drift.values()) <= ELASTIC_DRIFT, drift


def incarnations(job: str) -> list[str]:
    """What Slurm saw of a job: one state per incarnation (an in-job restart adds none)."""
    from slurmkit.slurm import commands

    return commands.incarnation_states(job)


def test_kill_9_of_one_rank_restarts_in_the_job_then_requeues_once_in_job_restarts_are_spent(
        cluster: None, dev_profile: Path, reference: dict[str, Any]) -> None:
    """One in-job restart allowed: the first kill starts a new srun step in the same allocation, the
    second (in that step) sends the job through the queue, which resumes it."""
    paths, job = start(dev_profile, "profile.requeue.in_job=1", "profile.requeue.standby=true", *FINE_LOG)
    signal_rank_at_step(paths, 1, 75, signal.SIGKILL)
    wait_until(lambda: any(r.in_job and r.resumed_step is not None
                           for r in RunFile(paths).read().restarts), what="the in-job restart")
    assert jobs.run_state(paths).state == "RUNNING" and incarnations(job) == ["RUNNING"]
    # Mid-interval, so that no save is in flight: a crash then costs at most checkpoint_every steps.
    now = (steps_done(paths) or [0])[-1]
    killed_at = now - now % EVERY + EVERY // 2 + (EVERY if now % EVERY > EVERY // 2 - 10 else 0)
    signal_rank_at_step(paths, 1, killed_at, signal.SIGKILL)
    result = check(paths, reference, max_lost=2 * EVERY)  # each crash: back to the last commit
    assert result["restart_causes"] == ["crash", "crash"] and result["in_job_restarts"] == 1
    first, second = RunFile(paths).read().restarts
    assert (first.in_job, first.n, first.resumed_step) == (1, 0, 50)
    assert second.in_job is None and second.n == 1
    assert incarnations(job) == ["REQUEUED", "COMPLETED"]
    decided = [(d["action"], d["cause"]) for d in supervisor_events(paths.run_dir, "decision")]
    assert decided == [("restart_in_job", "crash"), ("requeue", "crash")]
    assert_standby_took(paths, 1)  # and the second incarnation's own standby took nothing
    from slurmkit.insight import report

    data = report.collect(paths)  # the timeline: the in-job restart is a mark on the first incarnation's bar
    assert [([c for _, c in seg.in_job], seg.cause) for seg in data.segments] == [(["crash"], "crash"), ([], "")]
    assert data.summary["in_job"] == [True, False]


def test_sigstop_of_one_rank_is_a_hang_restarted_in_the_job(cluster: None, dev_profile: Path,
                                                           reference: dict[str, Any]) -> None:
    paths, job = start(dev_profile, "config.hang_timeout_s=6", "profile.requeue.standby=true", *FINE_LOG)
    signal_rank_at_step(paths, 1, 75, signal.SIGSTOP)
    result = check(paths, reference)
    assert result["restart_causes"] == ["hang"] and result["in_job_restarts"] == 1
    assert "slurmkit watchdog: no step progress" in "\n".join(run_logs.logs(paths, rank=0))
    # The watchdog's own record of the hang: a live rank waited past the timeout, then gave up.
    (restart,) = RunFile(paths).read().restarts
    assert json.loads(restart.detail)["idle_s"] >= 6  # recorded to 0.1 s: 6.04 s is written 6.0
    assert restart.in_job == 1 and incarnations(job) == ["COMPLETED"]  # never through the queue
    assert_standby_took(paths, 1)


def assert_standby_took(paths: RunPaths, attempt: int) -> None:
    """Each rank of the in-job attempt was a standby process, its imports paid before the failure."""
    for rank in (0, 1):
        log = "\n".join(run_logs.logs(paths, rank=rank))
        assert log.count(f"standby rank takes in-job attempt {attempt} (its imports took") == 1, rank


def test_sigkill_during_a_checkpoint_write(cluster: None, dev_profile: Path, reference: dict[str, Any]) -> None:
    # Rank 0 SIGKILLs itself once the first file of step 100's save is written (an event, not a race
    # against a 50-100 ms window); srun's --kill-on-bad-exit takes rank 1 down with it.
    paths, job = start(dev_profile, f"config.faults.kill_in_save_at_step={2 * EVERY}")
    result = check(paths, reference, max_lost=2 * EVERY)  # back to step 50, and the steps run during the save
    assert result["restart_causes"] == ["crash"] and result["in_job_restarts"] == 1
    log = "\n".join(run_logs.logs(paths, rank=0))
    assert f"injected SIGKILL during the save of step {2 * EVERY}, after" in log
    assert f"checkpoint step-{2 * EVERY} is incomplete or corrupt; falling back" in log  # the next start saw it
    assert result["resumed_from_step"] == EVERY and incarnations(job) == ["COMPLETED"]


def test_corrupt_newest_checkpoint_falls_back(cluster: None, dev_profile: Path, reference: dict[str, Any]) -> None:
    paths, job = start(dev_profile)
    wait_step(paths, 110)
    subprocess.run(["scontrol", "requeue", job], check=True)
    # The ranks may go on (and save) until Slurm's SIGKILL; corrupt what is newest once they are gone.
    wait_until(lambda: jobs.run_state(paths).state not in ("RUNNING", "COMPLETING"), what="the job to stop")
    store = CheckpointStore(str(paths.checkpoints))
    newest, previous = store.committed()[:2]
    (paths.checkpoints / f"step-{newest}" / "model.pt").write_bytes(b"corrupted")
    result = check(paths, reference, max_lost=2 * EVERY)  # the newest interval is gone with the corruption
    assert result["resumed_from_step"] == previous


def test_an_error_on_one_rank_restarts_warm_in_the_same_processes_twice(
        cluster: None, dev_profile: Path, reference: dict[str, Any]) -> None:
    """The last rank raises in the forward of steps 75 and 120 (its processes live on): both ranks
    restart in the process from their live state at the start of the failed step (74 and 119: no
    step lost, nothing read from storage), with no new srun step and no requeue."""
    paths, job = start(dev_profile, "config.faults.transient_error_at_steps=[75,120]", *FINE_LOG)
    result = check(paths, reference)
    assert result["restart_causes"] == ["crash", "crash"] and result["warm_restarts"] == 2
    restarts = RunFile(paths).read().restarts
    assert [(r.in_job, r.kind, r.step, r.resumed_step, r.lost_steps) for r in restarts] == [
        (1, "warm", 74, 74, 0), (2, "warm", 119, 119, 0)]
    assert all(r.live for r in restarts)
    assert "injected transient error at step 75 on rank 1" in restarts[0].detail
    firsts = [r for r in iter_records(paths.metrics) if "warm_restart" in r]
    assert [(r["step"], r["warm_restart"]["resumed_step"]) for r in firsts] == [(75, 74), (120, 119)]
    assert executed_steps(paths.metrics) == list(range(1, STEPS + 1))  # none ran twice
    assert not [r for r in iter_records(paths.metrics) if "startup" in r][1:]  # one process start per rank
    log = "\n".join(run_logs.logs(paths, rank=0))
    assert "warm restart: back at step 119 from the live state (no step lost), group generation 2" in log
    assert incarnations(job) == ["COMPLETED"]
    from slurmkit.insight import report

    (seg,) = report.collect(paths).segments
    assert [c for _, c in seg.in_job] == ["crash, warm", "crash, warm"]


def test_deterministic_error_is_not_requeued_twice(cluster: None, dev_profile: Path) -> None:
    paths, _ = start(dev_profile, "config.faults.error_at_step=60", f"config.checkpoint_every={EVERY}")
    assert finish(paths) == "FAILED"
    record = RunFile(paths).read()
    # The second try is a warm restart in the same processes; the third would fail the same way.
    assert [(r.cause, r.in_job, r.kind) for r in record.restarts] == [("crash", 1, "warm")]
    assert "deterministic error at step 60" in (record.final or "")
    failed = failure(paths, record.job_ids[-1])
    assert failed.cause.endswith("InjectedError: injected error at step 60"), failed


def test_time_limit_signal_is_a_timeout_and_resumes(cluster: None, dev_profile: Path) -> None:
    """The one real time limit: 1 minute, the signal 10 s before it (Slurm may send it up to ~30 s early).
    The first incarnation holds after step 10 until a stop signal comes, so it surely meets the limit."""
    paths, _ = start(dev_profile, "resources.time=00:01:00", "profile.signal_delay_s=10",
                     "config.faults.hold_at_step=10")
    assert finish(paths, timeout_s=420) == "COMPLETED"
    result = jobs.result(paths)
    assert result["steps"] == STEPS and result["restarts"] >= 1
    assert set(result["restart_causes"]) == {"timeout"}
    # The ranks agreed on the signal at the next step boundary, saved there and resumed from it.
    assert RunFile(paths).read().restarts[0].resumed_step == 11
    assert executed_steps(paths.metrics) == list(range(1, STEPS + 1))  # nothing recomputed


# ------------------------------------------------------------- real preemption by a higher partition

def urgent_job() -> str:
    """A plain 2-node job on the dev cluster's `urgent` partition that needs the whole of both nodes:
    Slurm itself picks the debug/scavenger run as its victim (preempt/partition_prio)."""
    from slurmkit.devcluster import names

    out = subprocess.run(["sbatch", "--parsable", "-p", names.URGENT_PARTITION, "-N", "2", "--exclusive", "-t", "2",
                          "-o", "/dev/null", "--wrap", "sleep 3"], check=True, capture_output=True, text=True)
    return out.stdout.strip()


def sacct_times(job: str) -> list[tuple[str, str, str]]:
    """(state, start, end) of every incarnation of a job, oldest first."""
    out = subprocess.run(["sacct", "-X", "-n", "-P", "--duplicates", "-j", job, "-o", "state,start,end"],
                         check=True, capture_output=True, text=True).stdout
    return [tuple(ln.split("|")) for ln in out.splitlines() if ln.strip()]  # type: ignore[misc]


def test_real_preemption_of_an_fsdp_run_by_the_urgent_partition_requeues_within_grace_time(
        cluster: None, dev_profile: Path, fsdp_reference: dict[str, Any]) -> None:
    """PreemptMode=REQUEUE, no user signal: the ranks get SIGTERM only. A job that exits within its
    GraceTime is COMPLETED for Slurm, so rank 0 must ask for the requeue itself, in time: here with
    every rank writing its shard of the agreed step (FSDP2); DDP's stop under USR2 is tested above."""
    paths, job = start(dev_profile, FSDP)
    wait_step(paths, 60)
    urgent = urgent_job()
    result = check(paths, fsdp_reference, max_lost=0)  # saved at the agreed step, inside the grace
    assert result["restart_causes"] == ["preemption"]
    assert jobs.run_state(paths).restarts == 1  # what `slurmkit status` shows
    (restart,) = RunFile(paths).read().restarts
    assert "PreemptMode=REQUEUE" in restart.detail and restart.lost_steps == 0
    (decided,) = supervisor_events(paths.run_dir, "decision")  # the supervisor asked, inside GraceTime
    assert (decided["action"], decided["cause"], decided["restart_count"]) == ("requeue", "preemption", 0)
    # Slurm really preempted it: the urgent job ran in the gap between the two incarnations.
    first, second = sacct_times(job)[:2]
    (u_state, u_start, u_end), = sacct_times(urgent)
    assert first[0] == "REQUEUED" and u_state == "COMPLETED"
    assert first[2] <= u_start and u_end <= second[1]  # ISO times compare as strings


@pytest.fixture
def user_signal_on_preemption(cluster: None) -> Any:
    """The cluster's other preemption style: Slurm sends the job's --signal (USR2, to the batch shell)
    at preemption time, before GraceTime's SIGTERM (`devcluster up --preempt-user-signal`)."""
    from slurmkit.devcluster import cluster as dc
    from slurmkit.devcluster.names import Variant

    dc.up(2, log=lambda _: None, variant=Variant(preempt_user_signal=True))
    try:
        yield
    finally:
        dc.up(2, log=lambda _: None)


def test_preemption_under_cancel_ends_preempted_and_resubmit_resumes_it(
        user_signal_on_preemption: None, tmp_path: Path, run_root: Path, reference: dict[str, Any]) -> None:
    """PreemptMode=CANCEL, with the user signal first: USR2 must read as preemption, not as the
    time limit, though Slurm has just cut the job's end time to the grace."""
    from typer.testing import CliRunner

    from slurmkit.cli.app import app
    from slurmkit.devcluster import names
    from slurmkit.errors import JobFailedError

    profile = write_dev_profile(tmp_path / "scavenger.yaml", run_root, partition=names.CANCEL_PARTITION)
    paths, job = start(profile)
    wait_step(paths, 60)
    urgent_job()
    assert finish(paths) == "PREEMPTED"  # Slurm says COMPLETED: the job saved and left within its grace
    assert len(sacct_times(job)) == 1  # and it did not come back by itself
    with pytest.raises(JobFailedError, match="PreemptMode=CANCEL") as err:
        jobs.result(paths)
    assert f"slurmkit resubmit {paths.run_id}" in err.value.one_line()
    assert "SIGUSR2" in [e["signal"] for e in supervisor_events(paths.run_dir, "signal")]  # passed to the ranks
    marked = RunFile(paths).read().preempted
    assert marked is not None
    stopped = marked.step
    runner = CliRunner()
    out = runner.invoke(app, ["resubmit", paths.run_id, "-p", str(profile), "--partition", names.PARTITION,
                              "--wait", "--json"])
    assert out.exit_code == 0, out.output
    answer = json.loads(out.stdout)
    assert answer["state"] == "COMPLETED" and answer["job_id"] != job and answer["run_id"] == paths.run_id
    assert answer["result"]["params_sha256"] == reference["params_sha256"]
    assert executed_steps(paths.metrics) == list(range(1, STEPS + 1))  # resumed at the stop step: none lost
    record = RunFile(paths).read()
    assert record.job_ids == [job, answer["job_id"]] and record.preempted is None
    (restart,) = record.restarts
    assert restart.cause == "resubmit" and restart.resumed_step == stopped and restart.lost_steps == 0
    assert sacct_times(answer["job_id"])[0][0] == "COMPLETED"
    again = runner.invoke(app, ["resubmit", paths.run_id, "-p", str(profile)])
    assert again.exit_code != 0 and "COMPLETED" in again.output and "Traceback" not in again.output


def test_a_save_longer_than_grace_time_resumes_from_the_last_commit_and_says_what_was_lost(
        cluster: None, dev_profile: Path, reference: dict[str, Any]) -> None:
    # The stop's save takes 40 s. GraceTime is 20, but the ranks are killed later than that: with
    # 30 s the save was measured to finish in time, so 40 it stays.
    paths, job = start(dev_profile, "config.faults.slow_stop_save_s=40", "config.hang_timeout_s=300")
    wait_step(paths, 60)
    urgent_job()
    result = check(paths, reference, max_lost=EVERY)
    assert result["restart_causes"] == ["preemption"]
    (restart,) = RunFile(paths).read().restarts
    assert restart.detail == "slurm state PREEMPTED"  # no marker: the ranks never got to ask
    log = "\n".join(run_logs.logs(paths, rank=0))
    (stopped,) = map(int, re.findall(r"injected 40 s delay in the stop's save of step (\d+)", log))
    committed = (stopped - 1) // EVERY * EVERY  # the last periodic save before the stop's own
    assert result["resumed_from_step"] == committed
    # The stop step's own metrics record was never written (killed in its save); the stop marker says it.
    assert restart.lost_steps == stopped - committed > 0
    from slurmkit.insight import report

    assert report.collect(paths).summary["lost_steps"] == [restart.lost_steps]  # what `slurmkit report` says


def test_fsdp_under_torchrun_preempted_loses_no_step_and_ends_bitwise_the_uninterrupted_srun_run(
        cluster: None, dev_profile: Path, fsdp_reference: dict[str, Any]) -> None:
    """config.parallel=fsdp: FSDP2 over 2 nodes (gloo), sharded checkpoints through DCP, and
    `launcher: torchrun`: one torchrun per node, the requeue signal reaching the ranks through the
    node's shell (torchrun would die of it). USR2 at step 60: every rank stops at one step and writes
    its shard, rank 0 requeues, the next job goes on; the end equals an uninterrupted FSDP run's under
    srun (same ranks, same data), every parameter bitwise. One run for both: the launcher and the
    Trainer's parallelism are independent (DDP under torchrun: the user-script tests in
    test_cluster_jobs.py; FSDP under srun: the reference)."""
    paths, job = start(dev_profile, FSDP, "launcher=torchrun")
    assert "torch.distributed.run" in paths.script.read_text()
    wait_step(paths, 60)
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    result = check(paths, fsdp_reference, max_lost=0)
    assert result["restart_causes"] == ["preemption"] and result["world_size"] == 2
    assert executed_steps(paths.metrics) == list(range(1, STEPS + 1))  # no step lost, none run twice
    store = CheckpointStore(str(paths.checkpoints))
    manifest = store.manifest(store.committed()[0])
    assert manifest is not None and manifest["format"] == "dcp" and {"__0_0.distcp", "__1_0.distcp"} <= set(
        manifest["files"])


def test_a_crash_loop_back_to_the_same_checkpoint_ends_no_progress_with_budget_left(
        cluster: None, dev_profile: Path) -> None:
    """Rank 1 killed after every restart, before the next save: each restart comes back to step 150
    (150 steps, about 6 s, before the next commit). The third such restart is the last
    (requeue.no_progress_restarts: 3), though the crash budget has six left; the decision says why."""
    every = 150
    paths, _ = start(dev_profile, "profile.requeue.crash=9", "profile.requeue.in_job=2", "config.steps=400",
                     f"config.checkpoint_every={every}", *FINE_LOG)
    signal_rank_at_step(paths, 1, every + 10, signal.SIGKILL)  # after the commit of step 150
    for n in (1, 2, 3):
        wait_until(lambda: len(RunFile(paths).read().restarts) == n  # noqa: B023 - waited on at once
                   and RunFile(paths).read().restarts[-1].resumed_step == every, 180, f"restart {n} back at 150")
        os.kill(rank_pid(paths, 1), signal.SIGKILL)
    assert finish(paths) == "FAILED"
    record = RunFile(paths).read()
    assert [(r.cause, r.resumed_step) for r in record.restarts] == [("crash", every)] * 3
    assert record.left(Cause.CRASH) == 6
    assert supervisor_events(paths.run_dir, "decision")[-1]["why"] == "no_progress"


def test_ranks_frozen_before_their_first_step_are_a_startup_hang_seen_from_inside_then_from_outside(
        cluster: None, dev_profile: Path, reference: dict[str, Any]) -> None:
    """Attempt 0: rank 1 stopped (SIGSTOP) while it starts; rank 0 waits for it in the rendezvous
    until its own startup timeout (15 s here) fires. Attempt 1: both ranks stopped, so neither can
    fire: the supervisor sees rank 0's watch pass its deadline with no first step and ends the step
    itself. Each time the step ends rather than hold the allocation to its time limit, and the
    in-job restart, a hang's path, runs the run again; it completes."""
    paths, job = start(dev_profile, "profile.startup_timeout_s=15", "profile.requeue.in_job=2")

    def pid_of(rank: int, other_than: int = 0) -> int | None:
        try:
            pid = ranks.rank_pid(paths, rank)
        except LookupError:
            return None
        return pid if pid != other_than else None

    def watched(attempt: int) -> StartupWatched | None:
        return StartupWatched.read(paths, job, 0, attempt)

    wait_until(lambda: pid_of(1) is not None, 120, "rank 1's process")  # while it imports torch
    first = pid_of(1) or 0
    os.kill(first, signal.SIGSTOP)
    wait_until(lambda: watched(1) is not None and pid_of(0) is not None and pid_of(1, first) is not None, 240,
               "attempt 1's ranks, rank 0's startup watch begun")
    frozen = [pid_of(0) or 0, pid_of(1, first) or 0]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    assert (watched(1) or StartupWatched("", 0, 0, 0.0, 0.0, 1.0)).first_step is None  # frozen before it
    check(paths, reference)
    assert [r.cause for r in RunFile(paths).read().restarts] == ["startup_hang", "startup_hang"]
    decided = [(d["action"], d["cause"]) for d in supervisor_events(paths.run_dir, "decision")]
    assert decided == [("restart_in_job", "startup_hang")] * 2
    assert [e["attempt"] for e in supervisor_events(paths.run_dir, "startup_hang_outside")] == [1]


def test_a_lasting_straggler_with_a_spare_node_is_replaced_in_the_job(cluster: None, dev_profile: Path) -> None:
    """straggler_action: replace. A 1-node run of two ranks with a spare node: rank 1 slowed as in
    the test below, named, and named for its patience (2 s): the supervisor asks the policy, the
    ranks stop at an agreed step and save, and the next step runs on the spare, node2. The run
    completes in the same incarnation, node1 blamed in the ledger."""
    paths, job = start(dev_profile, "resources.nodes=1", "resources.spare_nodes=1", "resources.tasks_per_node=2",
                       "config.steps=150", "config.batch_size=64", "profile.straggler_action=replace",
                       "profile.straggler_patience_s=2", "env.SLURMKIT_STRAGGLER_PERIOD_S=1")
    wait_step(paths, 1)
    pid = rank_pid(paths, 1)

    def replaced() -> bool:
        return any(d["action"] == "replace_in_job" for d in supervisor_events(paths.run_dir, "decision"))

    assert slow_down(pid, replaced)
    assert finish(paths) == "COMPLETED", failure(paths, job).log_tail
    (entry,) = RunFile(paths).read().restarts
    assert (entry.kind, entry.cause, entry.exclude) == ("in_job", "node_failure", ["node1"])
    assert step_nodes(job) == {f"{job}.0": "node1", f"{job}.1": "node2"} and incarnations(job) == ["COMPLETED"]
    assert executed_steps(paths.metrics)[-1] == 150
    assert ("node1", "straggler") in [(b.node, b.cause) for b in NodeLedger(names.CLUSTER_NAME).blames()]


def test_a_rank_slowed_from_outside_is_named_a_straggler_and_its_node_blamed(cluster: None, dev_profile: Path) -> None:
    """Rank 1 stopped 2/3 of the time (SIGSTOP/SIGCONT, 20 ms of every 30, far shorter than its
    forward pass at batch 64): its forward passes and optimizer steps take about 3x longer, rank 0's
    do not (it waits in the all-reduce, which is not its own work). Readings every second here:
    within a few, `status` names rank 1, and its node is blamed in the ledger."""
    paths, _ = start(dev_profile, "config.steps=100000", "config.batch_size=64", "env.SLURMKIT_STRAGGLER_PERIOD_S=1")
    wait_step(paths, 1)
    pid = rank_pid(paths, 1)
    try:
        slow_down(pid, lambda: bool(jobs.run_state(paths).stragglers))  # a look every 3 s; the run outlasts them
        named = jobs.run_state(paths).stragglers
    finally:
        jobs.cancel(paths)
    assert [(s["rank"], s["node"]) for s in named] == [(1, "node2")] and named[0]["score"] < 0.7
    assert [(b.node, b.cause) for b in NodeLedger(names.CLUSTER_NAME).blames()] == [("node2", "straggler")]
