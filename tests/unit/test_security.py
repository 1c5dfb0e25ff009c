"""Safe on a shared cluster: what another user plants in a shared folder is never acted on, slurmkit's
own interpreters never import from the working folder, the run's store and Ray need the run's
secret, and bad input is one line. Each test reproduces an attack first (docs/security.md's table).

Tests that make a file another user's, or run slurmkit as another user, need root (CI runs as root).
"""

from __future__ import annotations

import json
import os
import pickle
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from slurmkit import trust
from slurmkit.cli.app import app
from slurmkit.common.layout import RunPaths
from slurmkit.common.locked import CorruptRecordError
from slurmkit.errors import ConfigError, SlurmkitError
from slurmkit.runs import jobs, lookup, procs, registry
from slurmkit.runs.folders import find_sweep
from slurmkit.runs.lookup import find_run
from slurmkit.runs.snapshot import take
from slurmkit.worker.checkpoint.store import CheckpointError, CheckpointStore
from tests.conftest import write_spec

ROOT = Path(__file__).resolve().parents[2]
OTHER_UID = 65534  # nobody
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
runner = CliRunner()


class Evil:
    """Unpickling this runs code: it creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, ...]]:
        return (os.system, (f"touch {self.marker}",))


def plant_run(folder: Path, record: dict[str, object], owner: int | None = None) -> Path:
    """A run folder as another user leaves it in a shared folder."""
    (folder / "submitit").mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"run_id": folder.name, "name": folder.name, "num_tasks": 1,
                                                 **record}))
    if owner is not None:
        for path in (folder, folder / "submitit", folder / "run.json"):
            os.chown(path, owner, owner)
    return folder


@pytest.fixture
def stand_in_scancel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in scancel (named so: no Slurm needed) that records that it ran, and its arguments."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "scancel-calls"
    bin_dir.mkdir()
    (bin_dir / "scancel").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scancel").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return calls


# ------------------------------------------------------------------ 1. found by name in others' folders

@needs_root
def test_a_bare_id_is_never_looked_up_in_the_working_folder(tmp_path: Path, run_root: Path, local_profile: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            stand_in_scancel: Path) -> None:
    shared = tmp_path / "scratch"
    shared.mkdir()
    plant_run(shared / "evil", {"executor": "slurm", "job_ids": ["--user=alice"]}, owner=OTHER_UID)
    monkeypatch.chdir(shared)
    for argv in (["cancel", "evil"], ["status", "evil"], ["resubmit", "evil"], ["report", "evil"]):
        result = runner.invoke(app, [*argv, "-p", str(local_profile)])
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit), (argv, result.output)
        assert "no run 'evil'" in result.stderr
    # Named by path it is found, and refused: another user's folder.
    result = runner.invoke(app, ["cancel", "./evil", "-p", str(local_profile)])
    assert result.exit_code == 2
    with pytest.raises(trust.NotOwnError):
        find_run(str(run_root), "./evil")
    assert not stand_in_scancel.exists()


def test_a_record_whose_job_ids_are_options_never_reaches_scancel(tmp_path: Path, run_root: Path,
                                                                 local_profile: Path,
                                                                 stand_in_scancel: Path) -> None:
    plant_run(run_root / "mine", {"executor": "slurm", "job_ids": ["--user=alice"]})
    with pytest.raises(CorruptRecordError) as err:
        jobs.cancel(lookup.find(str(run_root), "mine"))
    assert err.value.where is not None and err.value.where.endswith("run.json:job_ids")
    assert runner.invoke(app, ["cancel", "mine", "-p", str(local_profile)]).exit_code == 2
    assert not stand_in_scancel.exists()


@needs_root
def test_a_planted_local_record_never_signals_the_callers_process(tmp_path: Path, run_root: Path) -> None:
    victim = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert victim.stdout is not None and victim.stdout.readline() == "ready\n"
        start = procs.start_time(victim.pid)  # /proc/PID/stat is world-readable: anyone can read it
        folder = plant_run(tmp_path / "shared" / "run", {"executor": "local", "job_ids": [str(victim.pid)],
                                                          "pid_starts": {str(victim.pid): start}}, owner=OTHER_UID)
        with pytest.raises(trust.NotOwnError):
            jobs.cancel(find_run(str(run_root), f"{folder}/"))
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_report_replaces_a_planted_symlink_instead_of_writing_through_it(tmp_path: Path, run_root: Path) -> None:
    from slurmkit.insight import report

    folder = plant_run(run_root / "mine", {"executor": "local", "job_ids": []})
    precious = tmp_path / "precious"
    precious.write_text("keep me")
    (folder / "report.png").symlink_to(precious)
    report.write(RunPaths(folder), RunPaths(folder).report)
    assert precious.read_text() == "keep me"
    written = os.lstat(folder / "report.png")
    assert stat.S_ISREG(written.st_mode) and written.st_size > 0


@needs_root
def test_a_sweep_in_the_working_folder_or_of_another_user_is_never_resubmitted(
        tmp_path: Path, run_root: Path, local_profile: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "PWNED"
    planted = tmp_path / "scratch" / "evil"
    planted.mkdir(parents=True)
    (planted / "sweep.json").write_text(json.dumps({"profile": {"setup": {"commands": [f"touch {marker}"]}}}))
    for path in (planted, planted / "sweep.json"):
        os.chown(path, OTHER_UID, OTHER_UID)
    monkeypatch.chdir(planted.parent)
    for ident in ("evil", "./evil"):
        result = runner.invoke(app, ["sweep", "resubmit", ident, "-p", str(local_profile)])
        assert result.exit_code == 2, result.output
        with pytest.raises(SlurmkitError):
            find_sweep(str(run_root), ident)
    assert not marker.exists()


def test_a_path_to_a_folder_others_could_swap_is_refused(tmp_path: Path, run_root: Path) -> None:
    shared = tmp_path / "open"
    plant_run(shared / "mine", {"executor": "local", "job_ids": []})
    os.chmod(shared, 0o777)  # anyone may rename `mine` away and put theirs in its place, no sticky bit
    with pytest.raises(trust.NotOwnError):
        find_run(str(run_root), f"{shared}/mine")
    os.chmod(shared, 0o1777)
    assert find_run(str(run_root), f"{shared}/mine").run_dir == shared / "mine"


# ------------------------------------------------------------------ 2. nothing imported from the submit folder

def _planted_modules(folder: Path, marker: Path) -> None:
    for name in ("submitit.py", "slurmkit.py", "torch.py", "cloudpickle.py"):
        (folder / name).write_text(f"open({str(marker)!r}, 'a').write({name!r})\n")


def test_a_local_run_never_imports_slurmkits_own_modules_from_the_submit_folder(tmp_path: Path,
                                                                                  local_profile: Path) -> None:
    submit_dir, marker = tmp_path / "shared", tmp_path / "PWNED"
    submit_dir.mkdir()
    _planted_modules(submit_dir, marker)
    # The user's own module there is still theirs to import (a callable, and a command's own python).
    (submit_dir / "mymod.py").write_text("def f(a):\n    return a + 1\n")
    for spec in (write_spec(submit_dir, filename="call.yaml", name="call", callable="mymod:f", kwargs={"a": 41}),
                 write_spec(submit_dir, filename="cmd.yaml", name="cmd",
                            command=f"{sys.executable} -c 'import mymod; print(mymod.f(1))'")):
        proc = subprocess.run([str(ROOT / ".venv/bin/slurmkit"), "submit", spec.name, "-p", str(local_profile),
                               "--wait", "--json"], cwd=submit_dir, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["state"] == "COMPLETED", proc.stdout
    assert not marker.exists(), marker.read_text()


def test_every_interpreter_the_batch_script_starts_runs_with_safe_path(tmp_path: Path) -> None:
    from slurmkit.load.loader import resolve
    (tmp_path / "d.py").write_text("result = 1\n")
    for profile in ("devcluster", "gpu-pyxis", "hpc-apptainer"):
        for spec in ({"command": "true"}, {"command": "true", "launcher": "torchrun"},
                     {"ray": {"driver": "d.py"}, "resources": {"nodes": 2, "tasks_per_node": 1}}):
            path = write_spec(tmp_path, name="s", **spec)
            script = jobs.dry_run(resolve(path, profile)).script
            starts = [w for line in script.splitlines() for w in [line.split(" -m ", 1)[0]] if " -m " in line]
            assert starts, script
            for head in starts:  # every `python -m` of slurmkit's (and Ray's, torchrun's) is `python -P -m`
                assert head.endswith(" -P") or head.endswith(" -P -u"), (profile, spec, head)
            if spec.get("launcher"):  # torchrun starts each rank as `python -m`: it inherits the safe path
                assert "PYTHONSAFEPATH=1 exec " in script


# ------------------------------------------------------------------ 3. the run root's ancestors; compute-side pickles

def test_a_private_run_root_inside_a_folder_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    (shared / "runs").mkdir(mode=0o700)
    with pytest.raises(ConfigError) as err:
        registry.create(str(shared / "runs"), "x")
    assert "without the sticky bit" in err.value.what and str(shared) in err.value.what
    os.chmod(shared, 0o1777)
    assert registry.create(str(shared / "runs"), "x").run_dir.parent == shared / "runs"


@needs_root
def test_a_rank_refuses_a_job_pickle_another_user_planted(tmp_path: Path) -> None:
    from submitit.core.utils import DelayedSubmission

    folder, marker = tmp_path / "submitit", tmp_path / "PWNED"
    folder.mkdir()
    DelayedSubmission(print, "never").dump(folder / "7_submitted.pkl")
    with open(folder / "7_submitted.pkl", "wb") as f:
        pickle.dump(Evil(marker), f)
    os.chown(folder / "7_submitted.pkl", OTHER_UID, OTHER_UID)
    env = {**os.environ, "SLURM_JOB_ID": "7", "SUBMITIT_EXECUTOR": "slurm", "SLURM_PROCID": "0", "SLURM_NTASKS": "1",
           "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "node1"}
    proc = subprocess.run([sys.executable, "-P", "-u", "-m", "slurmkit.worker.rank", str(folder)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "NotOwnError" in proc.stderr, proc.stderr
    assert not marker.exists()
    os.chown(folder / "7_submitted.pkl", 0, 0)  # the control: the caller's own pickle is loaded (and runs)
    subprocess.run([sys.executable, "-P", "-u", "-m", "slurmkit.worker.rank", str(folder)], env=env,
                   capture_output=True, text=True, timeout=120)
    assert marker.exists()


def test_a_symlinked_pickle_is_never_followed(tmp_path: Path) -> None:
    real, link = tmp_path / "real.pkl", tmp_path / "link.pkl"
    real.write_bytes(pickle.dumps(1))
    link.symlink_to(real)
    with pytest.raises(trust.NotOwnError):
        trust.load_pickle(link, "the job")
    assert trust.load_pickle(real, "the job") == 1


# ------------------------------------------------------------------ 4. snapshot modes

@pytest.mark.parametrize(("kind", "folder_mode", "file_mode", "exec_mode"),
                         [("private", 0o700, 0o600, 0o700), ("group", 0o2750, 0o640, 0o750)])
def test_a_snapshot_gets_the_run_folders_modes_not_the_sources(tmp_path: Path, kind: str, folder_mode: int,
                                                                file_mode: int, exec_mode: int) -> None:
    source, run_dir = tmp_path / "src", tmp_path / "run"
    (source / "pkg").mkdir(parents=True)
    (source / "job.sh").write_text("echo hi\n")
    (source / "pkg" / "mod.py").write_text("X = 1\n")
    os.chmod(source / "job.sh", 0o775)  # group-writable and executable, as under umask 002
    os.chmod(source / "pkg" / "mod.py", 0o666)
    run_dir.mkdir(mode=0o700)
    if kind == "group":
        os.chmod(run_dir, 0o2750)
    previous = os.umask(0o002)
    try:
        take(run_dir / "code", source, 10)
    finally:
        os.umask(previous)

    def mode(p: Path) -> int:
        return stat.S_IMODE(p.stat().st_mode)

    code = run_dir / "code"
    assert (mode(code), mode(code / "pkg")) == (folder_mode, folder_mode)
    assert (mode(code / "job.sh"), mode(code / "pkg" / "mod.py")) == (exec_mode, file_mode)


# ------------------------------------------------------------------ 5. checkpoint folders

@needs_root
def test_a_checkpoint_folder_someone_else_created_first_is_never_resumed_from(tmp_path: Path) -> None:
    theirs = tmp_path / "ckroot" / "run-1"
    CheckpointStore(str(theirs)).commit(1_000_000, [])  # their committed step-1000000
    for path in (theirs, *theirs.rglob("*")):
        os.chown(path, OTHER_UID, OTHER_UID)
    with pytest.raises(CheckpointError):
        CheckpointStore(str(theirs))
    with pytest.raises(CheckpointError):  # nor through a symlink of theirs
        (tmp_path / "ckroot" / "run-2").symlink_to(theirs)
        CheckpointStore(str(tmp_path / "ckroot" / "run-2"))


def test_a_checkpoint_root_others_could_swap_folders_in_is_refused(tmp_path: Path) -> None:
    open_root = tmp_path / "ck"
    open_root.mkdir()
    os.chmod(open_root, 0o777)
    with pytest.raises(ConfigError) as err:
        registry.create(str(tmp_path / "runs"), "x", checkpoint_root=str(open_root / "mine"))
    assert err.value.where == f"profile:checkpoint_root={str(open_root / 'mine')!r}"
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())
    with pytest.raises(CheckpointError):  # and on the compute side, where the job opens it
        CheckpointStore(str(open_root / "run-1"))
    os.chmod(open_root, 0o1777)
    registry.create(str(tmp_path / "runs"), "x", checkpoint_root=str(open_root / "mine"))
    CheckpointStore(str(open_root / "run-1"))


# ------------------------------------------------------------------ 8. bad input: one line, exit 2

@pytest.fixture
def readable_dir() -> Iterator[Path]:
    """A folder another user can read (pytest's tmp_path is private)."""
    folder = Path(tempfile.mkdtemp(prefix="slurmkit-sec-"))
    os.chmod(folder, 0o755)
    yield folder
    subprocess.run(["rm", "-rf", str(folder)], check=False)


def _as_nobody(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """The CLI, in a forked child that has become another user (uid nobody). The interpreter lives in
    root's private home here, so the child keeps the parent's imports rather than starting a new one."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_cli_as, args=(argv, cwd, out))
    child.start()
    code, stdout, stderr = out.get(timeout=120)
    child.join(30)
    return subprocess.CompletedProcess(argv, code, stdout, stderr)


def _cli_as(argv: list[str], cwd: Path, out: object) -> None:
    os.chdir(cwd)
    os.setgroups([])
    os.setgid(OTHER_UID)
    os.setuid(OTHER_UID)
    result = CliRunner().invoke(app, argv)
    code = result.exit_code if isinstance(result.exception, SystemExit) or result.exception is None else -1
    out.put((code, result.stdout, result.stderr + (repr(result.exception) if code == -1 else "")))  # type: ignore[attr-defined]


def _one_line_error(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr


@needs_root
def test_a_run_root_that_is_another_users_private_folder_is_one_line(readable_dir: Path) -> None:
    private = readable_dir / "runs"
    private.mkdir(mode=0o700)  # root's
    profile = readable_dir / "p.yaml"
    profile.write_text(f"extends: local\nrun_root: {private}\n")
    profile.chmod(0o644)
    for argv in (["list"], ["status"], ["sweep", "list"]):
        _one_line_error(_as_nobody([*argv, "-p", str(profile)], readable_dir))


@needs_root
def test_local_cancel_of_a_process_the_caller_cannot_signal_is_one_line(readable_dir: Path) -> None:
    root_owned = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
                                  stdout=subprocess.PIPE, text=True)
    try:
        assert root_owned.stdout is not None and root_owned.stdout.readline() == "ready\n"
        runs = readable_dir / "runs"
        folder = plant_run(runs / "r", {"executor": "local", "job_ids": [str(root_owned.pid)],
                                        "pid_starts": {str(root_owned.pid): procs.start_time(root_owned.pid)}})
        for path in (runs, folder, folder / "submitit", folder / "run.json"):
            os.chown(path, OTHER_UID, OTHER_UID)
        for path in (runs, folder):
            os.chmod(path, 0o700)
        profile = readable_dir / "p.yaml"
        profile.write_text(f"extends: local\nrun_root: {runs}\n")
        profile.chmod(0o644)
        _one_line_error(_as_nobody(["cancel", "r", "-p", str(profile)], readable_dir))
        assert root_owned.poll() is None
    finally:
        root_owned.kill()
        root_owned.wait()


@pytest.mark.parametrize("field", ["run_root", "template_dir"])
def test_a_home_of_no_user_is_refused_by_validate_and_submit(tmp_path: Path, field: str) -> None:
    profile = tmp_path / "p.yaml"
    profile.write_text(f"extends: local\n{field}: ~nosuchuser/x\n")
    spec = write_spec(tmp_path, name="x", command="true")
    for argv in (["profiles", "validate", str(profile)], ["render", str(spec), "-p", str(profile)],
                 ["submit", str(spec), "-p", str(profile)]):
        result = runner.invoke(app, argv)
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit), (argv, result.output)
        assert f"p.yaml:{field}" in result.stderr


@pytest.mark.parametrize(("field", "value"), [("job_ids", 5), ("num_tasks", "x"), ("restarts", 5),
                                              ("job_ids", [["a"]]), ("num_tasks", 100_000_000)])
def test_a_record_of_the_wrong_shape_is_skipped_with_one_warning(tmp_path: Path, run_root: Path,
                                                                  local_profile: Path, field: str,
                                                                  value: object) -> None:
    plant_run(run_root / "bad", {"executor": "local", "job_ids": [], field: value})
    plant_run(run_root / "good", {"executor": "local", "job_ids": []})
    for argv in (["list"], ["status"]):
        result = runner.invoke(app, [*argv, "-p", str(local_profile)])
        assert result.exit_code == 0, result.output
        assert "good" in result.stdout and "bad" not in result.stdout
        assert f"bad/run.json:{field}" in result.stderr
    result = runner.invoke(app, ["status", "bad", "-p", str(local_profile)])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)


def _special_files(tmp_path: Path) -> dict[str, Path]:
    fifo, loop = tmp_path / "fifo.yaml", tmp_path / "loop.yaml"
    os.mkfifo(fifo)
    loop.symlink_to(loop)
    return {"/dev/zero": Path("/dev/zero"), "fifo": fifo, "loop": loop, "folder": tmp_path}


def test_specs_that_are_not_regular_files_are_one_line_without_hanging(tmp_path: Path, local_profile: Path) -> None:
    for name, path in _special_files(tmp_path).items():
        for argv in (["render", str(path)], ["sweep", str(path), "--dry-run"], ["submit", str(path)]):
            result = runner.invoke(app, [*argv, "-p", str(local_profile)])
            assert result.exit_code == 2 and isinstance(result.exception, SystemExit), (name, argv, result.output)


def test_profiles_on_the_search_path_that_are_not_regular_files_are_one_line(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "profiles"
    folder.mkdir()
    os.mkfifo(folder / "fifo.yaml")
    (folder / "loop.yaml").symlink_to(folder / "loop.yaml")
    (folder / "zero.yaml").symlink_to("/dev/zero")
    monkeypatch.setenv("SLURMKIT_PROFILE_PATH", str(folder))
    spec = write_spec(tmp_path, name="x", command="true")
    for name in ("fifo", "loop", "zero"):
        result = runner.invoke(app, ["render", str(spec), "-p", name])
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit), (name, result.output)
    assert runner.invoke(app, ["render", str(spec), "-p", "local"]).exit_code == 0  # the others still load


@pytest.mark.parametrize("sweep", [
    {"grid": {f"env.K{i}": list(range(10)) for i in range(12)}},
    {"random": {"n": 99999999999999999999, "params": {"env.X": {"uniform": [0, 1]}}}},
])
def test_a_sweep_over_the_task_cap_is_counted_and_refused_before_expanding(tmp_path: Path, local_profile: Path,
                                                                          sweep: dict[str, object]) -> None:
    spec = write_spec(tmp_path, name="s", command="true", sweep=sweep)
    result = runner.invoke(app, ["sweep", str(spec), "-p", str(local_profile), "--dry-run"])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert "s" in result.stderr and "spec.yaml:sweep" in result.stderr
    capped = tmp_path / "capped.yaml"
    capped.write_text(f"extends: {local_profile}\nsweep_max_tasks: 4\n")
    small = write_spec(tmp_path, filename="small.yaml", name="s", command="true", sweep={"grid": {"env.A": [1, 2, 3]}})
    assert runner.invoke(app, ["sweep", str(small), "-p", str(capped), "--dry-run"]).exit_code == 0
    big = write_spec(tmp_path, filename="big.yaml", name="s", command="true",
                     sweep={"grid": {"env.A": [1, 2, 3, 4, 5]}})
    assert runner.invoke(app, ["sweep", str(big), "-p", str(capped), "--dry-run"]).exit_code == 2
