"""A shared cluster has other users: nothing under run_root is unpickled by listing, status or the
requeue policy; other users' folders are skipped; modes are private; a bare pid is never trusted;
concurrent run.json updates are never lost; one bad record breaks nothing.

Tests that chown a folder to another user need root (CI and the README's test command run as root).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from slurmkit.cli.app import app
from slurmkit.common import outcomes, perms
from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RunFile, RunRecord
from slurmkit.errors import SlurmkitError
from slurmkit.runs import jobs, procs, registry
from slurmkit.runs.lookup import list_runs
from slurmkit.supervisor import effects, restarts
from slurmkit.supervisor.decision import Action
from tests.conftest import write_spec

OTHER_UID = 65534  # nobody
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


class Evil:
    """Unpickling this runs code: it writes the marker file named in its constructor."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, ...]]:
        return (os.system, (f"touch {self.marker}",))


def plant(run_root: Path, name: str, marker: Path, run_dir: str | None = None, executor: str = "local") -> Path:
    """A run folder as an attacker would leave it: a record and result pickles that run code."""
    folder = run_root / name
    (folder / "submitit").mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({
        "run_id": name, "name": name, "executor": executor, "num_tasks": 1, "job_ids": ["424242"],
        "run_dir": run_dir or str(folder)}))
    for job in ("424242",):
        with open(folder / "submitit" / f"{job}_0_result.pkl", "wb") as f:
            pickle.dump(("success", Evil(marker)), f)
    return folder


def test_list_and_status_never_unpickle_even_own_folders(tmp_path: Path, run_root: Path,
                                                         local_profile: Path) -> None:
    marker = tmp_path / "PWNED"
    plant(run_root, "planted", marker)
    for argv in (["list"], ["status"], ["status", "planted"], ["list", "--json"]):
        result = CliRunner().invoke(app, [*argv, "-p", str(local_profile)])
        assert result.exit_code == 0, result.output
        assert "planted" in result.output
    assert not marker.exists()


def test_requeue_policy_reads_outcomes_not_pickles(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    folder = plant(tmp_path, "run", marker)
    RunFile(RunPaths(folder)).update(profile={"requeue": {"crash": 0}})
    paths = RunPaths(folder)
    decision = effects.decide(paths, "424242", effects.step_failed(paths, "424242", 1))
    # No outcome record: a crash, not "completed"; its budget is 0.
    assert (decision.action, decision.cause, decision.why) == (Action.END, "crash", "budget")
    assert not marker.exists()


def test_record_run_dir_pointing_elsewhere_is_ignored(tmp_path: Path, run_root: Path, local_profile: Path) -> None:
    marker = tmp_path / "PWNED"
    elsewhere = plant(tmp_path / "elsewhere", "victim", marker)
    folder = run_root / "decoy"
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"run_id": "decoy", "executor": "local", "num_tasks": 1,
                                                 "job_ids": ["424242"], "run_dir": str(elsewhere)}))
    rows = jobs.status(str(run_root))
    assert [(r.run_id, r.run_dir) for r in rows] == [("decoy", str(folder))]
    with pytest.raises(SlurmkitError):  # no outcome in its own folder, and no pickle there either
        jobs.result(RunPaths(folder))
    assert not marker.exists()


@needs_root
def test_other_users_folders_are_skipped_with_a_count(tmp_path: Path, run_root: Path, local_profile: Path) -> None:
    marker = tmp_path / "PWNED"
    for name in ("theirs-1", "theirs-2"):
        folder = plant(run_root, name, marker)
        for path in (folder, folder / "run.json"):
            os.chown(path, OTHER_UID, OTHER_UID)
    mine = plant(run_root, "mine", marker)
    result = CliRunner().invoke(app, ["list", "-p", str(local_profile)])
    assert result.exit_code == 0, result.output
    assert "mine" in result.stdout and "theirs" not in result.stdout
    assert f"skipped 2 run folder(s) under {run_root} owned by other users" in result.stderr
    assert [p.run_id for p in list_runs(str(run_root))] == [mine.name]
    assert not marker.exists()


@needs_root
def test_result_unpickles_only_from_the_callers_unwritable_folder(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    folder = plant(tmp_path, "run", marker)
    paths = RunPaths(folder)
    outcomes.record(paths.outcome_file("424242", 0), outcomes.SUCCESS, value=None)
    os.chmod(folder, 0o770)  # group-writable: a group member could have swapped the pickle
    with pytest.raises(SlurmkitError, match="refusing to unpickle the result: .* is writable by its group"):
        jobs.result(paths)
    os.chmod(folder, 0o700)
    os.chown(paths.result_pickle("424242", 0), OTHER_UID, OTHER_UID)
    with pytest.raises(SlurmkitError, match=f"owned by uid {OTHER_UID}"):
        jobs.result(paths)
    assert not marker.exists()
    os.chown(paths.result_pickle("424242", 0), 0, 0)
    jobs.result(paths)  # the caller's own, private folder: unpickled (and here, the planted code runs)
    assert marker.exists()


def test_one_bad_record_does_not_break_listing(tmp_path: Path, run_root: Path, local_profile: Path) -> None:
    good = plant(run_root, "good", tmp_path / "unused")
    for name, text in (("garbage", "{not json"), ("empty-list", "[]"), ("empty-object", "{}"),
                       ("binary", "\udcff")):
        (run_root / name).mkdir()
        (run_root / name / "run.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    result = CliRunner().invoke(app, ["list", "-p", str(local_profile)])
    assert result.exit_code == 0, result.output
    assert good.name in result.stdout
    warnings = [ln for ln in result.stderr.splitlines() if ln.startswith("warning: skipped")]
    assert sorted(Path(w.split()[2].rstrip(":")).parent.name for w in warnings) == [
        "binary", "empty-list", "empty-object", "garbage"]
    bad = CliRunner().invoke(app, ["status", "garbage", "-p", str(local_profile)])
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1 and "run.json" in bad.stderr


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_local_run_folder_and_files_are_private(tmp_path: Path, run_root: Path, local_profile: Path) -> None:
    spec = write_spec(tmp_path, name="modes", callable="tests.helpers_fns:add", kwargs={"a": 1, "b": 2},
                      env={"SECRET_TOKEN": "hunter2"})
    result = CliRunner().invoke(app, ["submit", str(spec), "-p", str(local_profile), "--wait"])
    assert result.exit_code == 0, result.output
    (run_dir,) = [p.run_dir for p in list_runs(str(run_root))]
    assert _mode(run_dir) == 0o700
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    names = {p.name.split("_")[-1] for p in files}
    assert names >= {"run.json", "submitted.pkl", "result.pkl", "log.out", "0.json"}, names
    for path in files:
        assert _mode(path) & 0o077 == 0, f"{path} is {oct(_mode(path))}"
    for path in [p for p in run_dir.rglob("*") if p.is_dir()]:
        assert _mode(path) & 0o077 == 0, f"{path} is {oct(_mode(path))}"


def test_group_run_mode_gives_setgid_group_readable_folders(tmp_path: Path, run_root: Path) -> None:
    paths = registry.create(str(run_root), "grp", perms.GROUP)
    assert stat.S_IMODE(paths.run_dir.stat().st_mode) == 0o2750
    RunFile(paths).create(RunRecord(run_id=paths.run_id))
    registry.write_script(paths, "#!/bin/bash\n")
    assert _mode(paths.record) == 0o640 and _mode(paths.script) == 0o640
    private = registry.create(str(run_root), "priv")
    RunFile(private).create(RunRecord(run_id=private.run_id))
    assert _mode(private.run_dir) == 0o700 and _mode(private.record) == 0o600


def test_checkpoints_written_under_the_run_umask_are_not_world_readable(tmp_path: Path) -> None:
    from slurmkit.worker.checkpoint.store import CheckpointStore

    store = CheckpointStore(str(tmp_path / "ckpt"))
    with perms.umask(perms.PRIVATE):
        store.commit(1, [store.write(1, "model.pt", b"weights")])
    for path in (tmp_path / "ckpt").rglob("*"):
        assert _mode(path) & 0o007 == 0, f"{path} is {oct(_mode(path))}"


def test_a_reused_pid_is_neither_running_nor_signalled(tmp_path: Path, run_root: Path) -> None:
    # The controller the record names has ended; its pid now belongs to an unrelated process.
    # It says when its interpreter is up: SIGINT during start-up can be lost in an import lock
    # (seen once under load: KeyboardInterrupt ignored in _get_module_lock, and the wait timed out).
    unrelated = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
                                 stdout=subprocess.PIPE, text=True)
    try:
        assert unrelated.stdout is not None and unrelated.stdout.readline() == "ready\n"
        start = procs.start_time(unrelated.pid)
        assert start is not None
        paths = registry.create(str(run_root), "reused")
        RunFile(paths).create(RunRecord(run_id=paths.run_id, executor="local"))
        RunFile(paths).add_job_id(str(unrelated.pid), pid_start=start - 1)  # the dead controller's start
        assert jobs.run_state(paths).state != "RUNNING"
        assert jobs.cancel(paths) == []
        assert unrelated.poll() is None  # still alive: never signalled
        RunFile(paths).add_job_id(str(unrelated.pid), pid_start=start)  # now the record names this very process
        assert jobs.run_state(paths).state == "RUNNING"
        assert jobs.cancel(paths) == [str(unrelated.pid)]
        assert unrelated.wait(timeout=30) != 0
    finally:
        unrelated.kill()
        unrelated.wait()


def _restarts(run_dir: str, first: int, count: int) -> None:
    os.environ["PATH"] = "/nonexistent"  # no sacct: a restart without a marker is recorded as "unknown"
    paths = RunPaths(Path(run_dir))
    for n in range(first, first + count):
        restarts.record_restart(paths, str(90000 + n), n, None)


def _job_ids(run_dir: str, first: int, count: int) -> None:
    record = RunFile(RunPaths(Path(run_dir)))
    for n in range(first, first + count):
        record.add_job_id(str(n))


def test_concurrent_run_record_updates_are_never_lost(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run")
    paths.run_dir.mkdir()
    RunFile(paths).create(RunRecord(run_id="run", profile={"requeue": {"preemption": 1000}}))
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_restarts, args=(str(paths.run_dir), k * 100, 100)) for k in range(2)]
    workers += [ctx.Process(target=_job_ids, args=(str(paths.run_dir), k * 200, 200)) for k in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    record = RunFile(paths).read()
    assert sorted(int(j) for j in record.job_ids) == list(range(400))
    assert sorted(r.n for r in record.restarts) == list(range(200))


def test_outcome_records_hold_json_values_and_say_why_not(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    outcomes.record(path, outcomes.SUCCESS, value={"loss": 0.5})
    read = outcomes.read(path)
    assert read is not None and read.ok and read.value == {"loss": 0.5}
    outcomes.record(path, outcomes.SUCCESS, value=object())
    read = outcomes.read(path)
    assert read is not None and read.value is None and "not JSON-serializable (object)" in read.value_omitted
    with perms.umask(perms.PRIVATE):  # the job's umask
        outcomes.record(path, outcomes.ERROR, error="Traceback...\nValueError: bad\n")
    read = outcomes.read(path)
    assert read is not None and not read.ok and read.error_line == "ValueError: bad"
    assert _mode(path) == 0o600
    path.write_text("[]")
    assert outcomes.read(path) is None


def test_pid_start_time_is_the_process_own(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        first = procs.start_time(proc.pid)
        assert first is not None and procs.start_time(proc.pid) == first
        assert procs.same_process(proc.pid, first) and not procs.same_process(proc.pid, None)
    finally:
        proc.kill()
        proc.wait()
    assert procs.start_time(proc.pid) is None and not procs.same_process(proc.pid, first)


def test_a_run_root_others_could_swap_folders_in_is_refused(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, name="x", command="true")
    root = tmp_path / "shared"
    root.mkdir()
    prof = tmp_path / "p.yaml"
    prof.write_text(f"extends: local\nrun_root: {root}\n")
    os.chmod(root, 0o777)  # anyone may rename a run folder away and put their own pickles in its place
    result = CliRunner().invoke(app, ["submit", str(spec), "-p", str(prof), "--dry-run"])
    assert result.exit_code == 0  # a dry run creates nothing
    result = CliRunner().invoke(app, ["submit", str(spec), "-p", str(prof)])
    assert result.exit_code == 2 and "writable by others without the sticky bit" in result.stderr
    assert list(root.iterdir()) == []
    os.chmod(root, 0o1777)  # sticky, as /tmp: only a folder's owner may rename it
    result = CliRunner().invoke(app, ["submit", str(spec), "-p", str(prof), "--wait"])
    assert result.exit_code == 0, result.output
