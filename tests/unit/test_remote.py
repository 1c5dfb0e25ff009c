"""Commands from a laptop (another unix user) over one SSH connection to a real sshd on the loopback
address, the login host; here its profile runs jobs with the local executor (no Slurm), so these
tests are not cluster tests (test_cluster_faults.py's preemption test runs from the laptop)."""

from __future__ import annotations

import json
import os
import pwd
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from slurmkit.config.login import LoginHost
from slurmkit.remote.connection import Connection, HostKeyError, HostKeyProblem
from slurmkit.remote.request import Request, VersionMismatchError
from tests import sshd as sshd_mod
from tests.conftest import EXAMPLES


@pytest.fixture(scope="module")
def laptop(login_host: sshd_mod.Sshd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[sshd_mod.Laptop]:
    with sshd_mod.laptop(login_host, "sklaptop", tmp_path_factory.mktemp("wheel")) as user:
        yield user


@pytest.fixture(scope="module")
def cluster_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cluster account's run root: under pytest's root-only folder, out of the laptop's reach."""
    return tmp_path_factory.mktemp("cluster") / "runs"


@pytest.fixture(scope="module")
def site(laptop: sshd_mod.Laptop, login_host: sshd_mod.Sshd, cluster_runs: Path) -> Path:
    return laptop.profile("site", login_host, extends="local", run_root=str(cluster_runs))


def sk(laptop: sshd_mod.Laptop, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    done = laptop.slurmkit(*args, cwd=cwd)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def answer(done: subprocess.CompletedProcess[str]) -> object:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_series_of_commands_goes_over_one_authenticated_connection(
        laptop: sshd_mod.Laptop, login_host: sshd_mod.Sshd, site: Path, cluster_runs: Path) -> None:
    before = login_host.accepted()
    hello = answer(sk(laptop, "connect", "-p", str(site), "--json"))
    assert isinstance(hello, dict) and hello["slurmkit"] and hello["python_note"] is None
    spec = laptop.write("work/hello.yaml", "name: hello\ncommand: echo hello from $(id -un)\n")
    done = answer(sk(laptop, "submit", str(spec), "-p", str(site), "--wait", "--json"))
    assert isinstance(done, dict) and done["state"] == "COMPLETED"
    run_id = done["run_id"]
    assert Path(done["run_dir"]).parent == cluster_runs
    # The run folder is the cluster account's: the laptop user cannot read it but through slurmkit.
    assert subprocess.run(["runuser", "-u", laptop.user, "--", "test", "-r", done["run_dir"]]).returncode != 0
    rows = answer(sk(laptop, "status", run_id, "-p", str(site), "--json"))
    assert isinstance(rows, list) and [r["state"] for r in rows] == ["COMPLETED"]
    logs = sk(laptop, "logs", run_id, "-p", str(site))
    assert logs.returncode == 0 and logs.stdout.startswith("[0] ")
    result = answer(sk(laptop, "result", run_id, "-p", str(site), "--json"))
    assert isinstance(result, dict) and result["returncode"] == 0 and result["stdout"] == "hello from root\n"
    listed = answer(sk(laptop, "list", "-p", str(site), "--json"))
    assert isinstance(listed, list) and run_id in [r["run_id"] for r in listed]
    script = sk(laptop, "render", str(spec), "-p", str(site))  # the script the login host would submit
    assert script.returncode == 0 and script.stdout.startswith("#!/bin/bash") and str(cluster_runs) in script.stdout
    doctor = answer(sk(laptop, "doctor", "-p", str(site), "--json"))
    assert isinstance(doctor, (dict, list)) and doctor
    assert login_host.accepted() - before == 1  # connect's; the seven commands after it authenticated none


def test_the_code_goes_with_the_submit_in_a_snapshot(laptop: sshd_mod.Laptop, site: Path) -> None:
    code = laptop.home / "project"
    laptop.write("project/src/marker.py", "print('code from the laptop', 41 + 1)\n")
    spec = laptop.write("project/run.yaml", "name: snap\ncommand: python -P src/marker.py\nsnapshot: true\n")
    done = answer(sk(laptop, "submit", "run.yaml", "-p", str(site), "--wait", "--json", cwd=code))
    assert isinstance(done, dict) and done["state"] == "COMPLETED"
    assert spec.exists()
    assert "code from the laptop 42" in done["result"]["stdout"]
    rows = answer(sk(laptop, "status", done["run_id"], "-p", str(site), "--json"))
    assert isinstance(rows, list) and len(rows) == 1
    row = rows[0]
    assert row["snapshot"]["source"] == str(code) and row["snapshot"]["files"] == 2


def test_a_report_comes_back_to_the_laptop(laptop: sshd_mod.Laptop, site: Path) -> None:
    spec = laptop.write("work/gpt.yaml", (EXAMPLES / "train_gpt.yaml").read_text())
    done = answer(sk(laptop, "submit", str(spec), "-p", str(site), "--set", "config.steps=20", "--wait", "--json"))
    assert isinstance(done, dict) and done["state"] == "COMPLETED"
    out = laptop.home / "work" / "gpt.png"
    rep = answer(sk(laptop, "report", done["run_id"], "-p", str(site), "-o", str(out), "--json"))
    assert isinstance(rep, dict) and rep["incarnations"] == 1
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_uid == laptop.home.stat().st_uid


def test_a_sweep_from_the_laptop_with_its_status_and_results(laptop: sshd_mod.Laptop, site: Path) -> None:
    spec = laptop.write("work/sweep.yaml", "name: sw\ncommand: echo mode=$MODE\nsweep:\n  grid:\n"
                                           "    env.MODE: [a, b, c]\n  max_parallel: 2\n")
    done = answer(sk(laptop, "sweep", str(spec), "-p", str(site), "--wait", "--json"))
    assert isinstance(done, dict) and done["tasks"] == 3
    sweep_id = Path(done["sweep_dir"]).name
    rows = answer(sk(laptop, "sweep", "results", sweep_id, "-p", str(site), "--json"))
    assert isinstance(rows, list)
    assert [(r["env.MODE"], r["state"], r["returncode"]) for r in rows] == [(m, "COMPLETED", 0) for m in "abc"]
    status = sk(laptop, "sweep", "status", sweep_id, "-p", str(site))
    assert status.returncode == 0 and status.stdout.count("COMPLETED") >= 3


API_SCRIPT = """\
import json, sys
import slurmkit

def square(x):
    return {"squared": x * x}

profile = sys.argv[1]
ex = slurmkit.Executor(profile=profile)
job = ex.submit(square, 7)
mapped = ex.map_array(square, [1, 2, 3])
ended = [j.run_id for j in slurmkit.as_completed(mapped)]
again = slurmkit.Job.from_id(job.run_id, profile=profile)
failing = ex.submit_command("exit 5")
try:
    failing.result()
    failed = None
except slurmkit.JobFailedError as exc:
    failed = {"rank": exc.rank, "cause": exc.cause}
print(json.dumps({"result": job.result(), "mapped": [j.result() for j in mapped], "ended": sorted(ended),
                  "ids": sorted(j.run_id for j in mapped), "again": [again.run_id == job.run_id, again.state],
                  "failed": failed, "torch": "torch" in sys.modules}))
"""


def test_the_python_api_from_the_laptop(laptop: sshd_mod.Laptop, site: Path) -> None:
    script = laptop.write("work/api_script.py", API_SCRIPT)
    done = subprocess.run(["runuser", "-u", laptop.user, "--", "env", "-i",
                           *(f"{k}={v}" for k, v in laptop.env().items()), str(laptop.python), "-P", str(script),
                           str(site)], cwd=script.parent, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["result"] == {"squared": 49}  # a function defined on the laptop, by value, run there
    assert out["mapped"] == [{"squared": 1}, {"squared": 4}, {"squared": 9}]
    assert out["ended"] == out["ids"]  # as_completed gave every task once
    assert out["again"] == [True, "COMPLETED"]
    assert out["failed"] is not None and out["failed"]["rank"] == 0  # the typed error came back
    assert out["torch"] is False


def test_slurmkit_sweep_from_python_through_a_login_host_is_refused_in_one_line(tmp_path: Path) -> None:
    import slurmkit
    from slurmkit.errors import ConfigError

    profile = tmp_path / "site.yaml"
    profile.write_text("extends: local\nlogin: {host: hpc.example.org}\n")
    with pytest.raises(ConfigError) as refused:
        slurmkit.sweep({"name": "s", "command": "true", "sweep": {"grid": {"env.X": ["1"]}}}, profile=str(profile))
    assert refused.value.where == f"{profile}:login"


def test_logs_follow_streams_and_outlives_the_connection_killed_under_it(
        laptop: sshd_mod.Laptop, site: Path, cluster_runs: Path) -> None:
    flag = cluster_runs.parent / "follow-go"
    spec = laptop.write("work/follow.yaml", f"name: follow\ncommand: echo first; while [ ! -e {flag} ]; "
                                            "do sleep 0.2; done; echo last\n")
    sub = answer(sk(laptop, "submit", str(spec), "-p", str(site), "--json"))
    assert isinstance(sub, dict)
    follower = subprocess.Popen(laptop.argv("logs", sub["run_id"], "-p", str(site), "--follow"), cwd=laptop.home,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert follower.stdout is not None
    seen: list[str] = []
    while not any(ln.strip() == "[0] first" for ln in seen):  # streamed while the run still runs
        line = follower.stdout.readline()
        assert line, follower.communicate()
        seen.append(line)
    pid = master_pid(laptop)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    while master_pid(laptop) in (None, pid):  # the follow reopens it
        assert follower.poll() is None, follower.communicate()
        time.sleep(0.2)
    flag.touch()
    rest, err = follower.communicate(timeout=300)
    assert follower.returncode == 0, err
    lines = [ln.strip() for ln in seen + rest.splitlines()]
    assert lines.count("[0] first") == 1 and lines.count("[0] last") == 1  # nothing lost, nothing twice


def master_pid(laptop: sshd_mod.Laptop) -> int | None:
    found = subprocess.run(["pgrep", "-u", laptop.user, "-f", "ControlMaster=yes"], capture_output=True, text=True)
    pids = [int(p) for p in found.stdout.split()]
    return pids[0] if pids else None


def test_a_wait_outlives_the_connection_killed_under_it(laptop: sshd_mod.Laptop, login_host: sshd_mod.Sshd,
                                                        site: Path, cluster_runs: Path) -> None:
    flag = cluster_runs.parent / "go"
    spec = laptop.write("work/slow.yaml", f"name: slow\ncommand: while [ ! -e {flag} ]; do sleep 0.2; done; "
                                          "echo went on\n")
    waiter = subprocess.Popen(laptop.argv("submit", str(spec), "-p", str(site), "--wait"), cwd=laptop.home,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert waiter.stdout is not None
    first = waiter.stdout.readline()  # `run ID  job J  DIR`: the submit is done, the wait has begun
    assert first.startswith("run "), waiter.stderr.read() if waiter.stderr else ""
    pid = master_pid(laptop)
    assert pid is not None
    before = login_host.accepted()
    os.kill(pid, signal.SIGKILL)
    while master_pid(laptop) in (None, pid):  # the wait reopens it
        assert waiter.poll() is None, waiter.communicate()
        time.sleep(0.2)
    flag.touch()  # only now may the run end: it ended after the reconnect, seen by the second wait
    out, err = waiter.communicate(timeout=300)
    assert waiter.returncode == 0, err
    assert out.splitlines()[0] == "COMPLETED"
    assert login_host.accepted() - before == 1


def test_an_unknown_or_changed_host_key_is_refused(login_host: sshd_mod.Sshd, tmp_path: Path) -> None:
    identity = tmp_path / "id"
    sshd_mod.keygen(identity)
    known = tmp_path / "known_hosts"
    login = LoginHost(host="127.0.0.1", port=login_host.port, user="root", identity=str(identity),
                      known_hosts=str(known))
    before = login_host.accepted()
    known.write_text("")
    with pytest.raises(HostKeyError) as unknown:
        Connection(login, "site").open(interactive=False)
    other = tmp_path / "other_host_key"
    known.write_text(f"[127.0.0.1]:{login_host.port} {' '.join(sshd_mod.keygen(other).split()[:2])}\n")
    with pytest.raises(HostKeyError) as changed:
        Connection(login, "site").open(interactive=False)
    assert (unknown.value.problem, changed.value.problem) == (HostKeyProblem.UNKNOWN, HostKeyProblem.CHANGED)
    assert known.read_text().count("\n") == 1  # nothing was added
    assert login_host.accepted() == before


def test_a_laptop_command_refused_for_its_host_key_exits_3(laptop: sshd_mod.Laptop, login_host: sshd_mod.Sshd,
                                                           cluster_runs: Path) -> None:
    empty = laptop.write("empty_known_hosts", "")
    profile = laptop.write("profiles/stranger.yaml", Path(laptop.profile("s", login_host, extends="local",
                                                                          run_root=str(cluster_runs))).read_text()
                           .replace(str(laptop.known_hosts), str(empty)))
    done = laptop.slurmkit("status", "-p", str(profile))
    assert done.returncode == 3 and "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1


def test_every_command_is_either_forwarded_or_one_that_runs_here() -> None:
    import typer.main

    from slurmkit.cli.app import app
    from slurmkit.remote.forward import FORWARDED, LOCAL, SWEEP_COMMANDS

    group = typer.main.get_group(app)
    roots = {c.split()[0] for c in FORWARDED}
    assert set(group.commands) == roots | LOCAL and not roots & LOCAL
    assert set(group.commands["sweep"].commands) == SWEEP_COMMANDS  # type: ignore[attr-defined]


def test_versions_are_compared_on_the_login_host() -> None:
    here = {"slurmkit": "0.1.0", "python": "3.11.7"}
    Request("run", slurmkit="0.1.0", python="3.12.1").check_versions(here)  # a spec: Python may differ
    with pytest.raises(VersionMismatchError):
        Request("run", slurmkit="0.2.0", python="3.11.7").check_versions(here)
    with pytest.raises(VersionMismatchError):
        Request("run", slurmkit="0.1.0", python="3.12.1", pickled=True).check_versions(here)
    Request("run", slurmkit="0.1.0", python="3.11.2", pickled=True).check_versions(here)


def test_the_laptop_never_imports_torch_to_forward(laptop: sshd_mod.Laptop, site: Path) -> None:
    probe = laptop.write("probe.py", "import sys, runpy\nsys.argv = ['slurmkit'] + sys.argv[1:]\n"
                                     "try:\n    runpy.run_module('slurmkit', run_name='__main__')\n"
                                     "except SystemExit:\n    pass\nprint('torch' in sys.modules)\n")
    done = subprocess.run(["runuser", "-u", laptop.user, "--", "env", "-i",
                           *(f"{k}={v}" for k, v in laptop.env().items()), str(laptop.python), "-P", str(probe),
                           "status", "-p", str(site)], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "False", done.stderr


def as_other_user(*argv: str) -> None:
    """A command run as a second unix user (nobody), who shares the laptop's machine."""
    subprocess.run(["runuser", "-u", "nobody", "--", *argv], check=True, timeout=30)


def test_a_fetched_report_replaces_a_link_another_user_planted_never_follows_it(
        laptop: sshd_mod.Laptop, site: Path) -> None:
    bashrc = laptop.write(".bashrc", "# the laptop user's own\n")
    shared = Path(tempfile.mkdtemp(prefix="shared-", dir=laptop.home))
    os.chmod(shared, 0o777)  # a folder other users can write (no sticky bit: they may plant, we may replace)
    as_other_user("ln", "-s", str(bashrc), str(shared / "report.html"))
    spec = laptop.write("work/short.yaml", "name: short\ncommand: echo hi\n")
    done = answer(sk(laptop, "submit", str(spec), "-p", str(site), "--wait", "--json"))
    assert isinstance(done, dict)
    out = shared / "report.html"
    rep = sk(laptop, "report", done["run_id"], "-p", str(site), "-o", str(out), "--json")
    assert rep.returncode == 0, rep.stderr
    assert bashrc.read_text() == "# the laptop user's own\n"
    st = out.lstat()
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == laptop.home.stat().st_uid and out.read_text().startswith("<!doctype html>")


def test_a_login_host_on_debians_own_python_unpacks_the_code_and_refuses_a_link_out(
        laptop: sshd_mod.Laptop, login_host: sshd_mod.Sshd, cluster_runs: Path) -> None:
    """login.python is Debian 12's python3 (3.11.2, the laptop's venv), whose tarfile has no filter=."""
    text = Path(laptop.profile("deb", login_host, extends="local", run_root=str(cluster_runs))).read_text()
    profile = laptop.write("profiles/deb.yaml", text.replace(sys.executable, str(laptop.python)))
    code = Path(tempfile.mkdtemp(prefix="debcode-", dir=laptop.home))
    laptop.write(f"{code.name}/src/a.py", "A = 1\n")
    laptop.write(f"{code.name}/run.yaml", "name: deb\ncommand: python -P src/a.py\nsnapshot: true\n")
    subprocess.run(["runuser", "-u", laptop.user, "--", "ln", "-s", "src", str(code / "latest")], check=True)
    rendered = sk(laptop, "render", "run.yaml", "-p", str(profile), cwd=code)
    assert rendered.returncode == 0 and rendered.stdout.startswith("#!/bin/bash"), rendered.stderr
    subprocess.run(["runuser", "-u", laptop.user, "--", "ln", "-s", "/scratch/ds", str(code / "data")], check=True)
    refused = sk(laptop, "render", "run.yaml", "-p", str(profile), cwd=code)
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr


def test_known_hosts_of_another_user_or_writable_by_others_is_refused(login_host: sshd_mod.Sshd,
                                                                      tmp_path: Path) -> None:
    from slurmkit.trust import NotOwnError

    theirs = tmp_path / "theirs_known_hosts"
    theirs.write_text(login_host.known_hosts_line() + "\n")
    os.chown(theirs, pwd.getpwnam("nobody").pw_uid, -1)
    loose = tmp_path / "loose_known_hosts"
    loose.write_text(login_host.known_hosts_line() + "\n")
    os.chmod(loose, 0o666)
    for path in (theirs, loose):
        login = LoginHost(host="127.0.0.1", port=login_host.port, user="root", known_hosts=str(path))
        with pytest.raises(NotOwnError):
            Connection(login, "site").ssh_argv(["true"])
    with pytest.raises(ValidationError):  # ssh would read a second file after the space
        LoginHost(host="127.0.0.1", known_hosts=f"{loose} /tmp/planted_known_hosts")


class _Planted:
    """What a redirected connection would answer with: a pickle that runs a command when loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_an_answer_that_would_run_code_on_the_laptop_is_refused(tmp_path: Path) -> None:
    import base64
    import pickle

    from slurmkit.errors import SlurmkitError
    from slurmkit.remote.api import as_answer, plain_data

    marker = tmp_path / "ran"
    with pytest.raises(SlurmkitError):
        plain_data(pickle.dumps(_Planted(marker)))
    assert not marker.exists()
    value = {"loss": 0.5, "shape": (2, 3), "tags": {"a", "b"}, 7: b"\x00raw", "nested": [None, True, 1.5]}
    sent = as_answer(value)
    assert plain_data(base64.b64decode(str(sent["pickle"]))) == value
    with pytest.raises(SlurmkitError):  # said on the login host: not plain data
        as_answer(_Planted(marker))


def test_the_laptop_installs_slurmkit_light(laptop: sshd_mod.Laptop) -> None:
    """`pip install slurmkit` (the laptop's venv, with the wheel's own dependencies): no torch, numpy
    or scikit-learn; the ranks' interpreter gets torch through slurmkit[train]."""
    probe = "import importlib.util, json; print(json.dumps({m: importlib.util.find_spec(m) is not None for m in " \
            "('slurmkit', 'submitit', 'pydantic', 'torch', 'numpy', 'sklearn')}))"
    done = subprocess.run([str(laptop.python), "-P", "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"slurmkit": True, "submitit": True, "pydantic": True, "torch": False,
                                       "numpy": False, "sklearn": False}


def test_a_login_host_python_older_than_slurmkit_supports_is_one_line_at_connect(
        laptop: sshd_mod.Laptop, login_host: sshd_mod.Sshd, cluster_runs: Path) -> None:
    old = Path.home() / ".pyenv" / "versions" / "3.10.13" / "bin" / "python"
    if not old.exists():
        pytest.skip("no Python 3.10 here (pyenv's)")
    text = Path(laptop.profile("old", login_host, extends="local", run_root=str(cluster_runs))).read_text()
    profile = laptop.write("profiles/old.yaml", text.replace(sys.executable, str(old)))
    done = sk(laptop, "connect", "-p", str(profile))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
