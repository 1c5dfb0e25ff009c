"""Watching and touching a live run on the dev cluster: `slurmkit stack` (every rank's stack, a
stopped rank said to be stopped) and `slurmkit attach` (a shell on a rank's node, inside the job),
one training run for both; and `slurmkit shell` (an interactive allocation with the profile's
setup). The shells are typed into through a real terminal (tmux)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from slurmkit.cli.app import app
from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import RankProcess
from slurmkit.load.loader import resolve
from slurmkit.runs import jobs
from slurmkit.runs.stack import stacks
from slurmkit.slurm import interactive
from tests.cluster.test_cluster_faults import FINE_LOG, start, steps_done, wait_step
from tests.conftest import wait_until

pytestmark = pytest.mark.cluster
STANDINS = Path(__file__).resolve().parents[1] / "standins"


class Terminal:
    """A tmux session on a private server: keys typed in, the screen read back."""

    def __init__(self, name: str, command: str) -> None:
        if shutil.which("tmux") is None:
            pytest.fail("tmux is not installed (scripts/test.sh installs it)")
        self.base = ["tmux", "-L", f"slurmkit-test-{os.getpid()}"]
        subprocess.run([*self.base, "new-session", "-d", "-s", name, "-x", "200", "-y", "50", command], check=True)
        self.name = name

    def type(self, line: str) -> None:
        subprocess.run([*self.base, "send-keys", "-t", self.name, line, "Enter"], check=True)

    def screen(self) -> str:
        out = subprocess.run([*self.base, "capture-pane", "-p", "-J", "-S", "-200", "-t", self.name],
                             capture_output=True, text=True, check=False)
        return out.stdout

    def lines(self) -> list[str]:
        return [ln.rstrip() for ln in self.screen().splitlines()]

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True, check=False)


@pytest.fixture
def live_run(cluster: None, dev_profile: Path) -> Iterator[tuple[RunPaths, str]]:
    paths, job = start(dev_profile, "config.steps=100000", *FINE_LOG)
    try:
        wait_step(paths, 20)
        yield paths, job
    finally:
        subprocess.run(["scancel", job], check=True)


def test_stack_shows_every_ranks_training_loop_and_says_a_stopped_rank_is_stopped(
        live_run: tuple[RunPaths, str], dev_profile: Path) -> None:
    """`slurmkit stack`: each rank answers from the signal (faulthandler) with its threads' stacks,
    the run going on; a SIGSTOPped rank cannot answer, and is said to be stopped where it runs.
    Then `slurmkit attach --rank 1`, typed into a terminal: a shell on rank 1's node inside the job,
    in the run folder, which sees the run's files and its rank processes; `exit` leaves it."""
    paths, job = live_run
    shown = CliRunner().invoke(app, ["stack", paths.run_id, "-p", str(dev_profile), "--json"])
    assert shown.exit_code == 0, shown.output
    found = json.loads(shown.stdout)
    assert [(s["rank"], s["answered"]) for s in found] == [(0, True), (1, True)]
    assert all(" in train_step" in s["stack"] or " in fit" in s["stack"] for s in found), found
    before = steps_done(paths)[-1]
    wait_step(paths, before + 5)  # the run went on after it answered
    where = RankProcess.read(paths, job, 1)  # what the rank recorded of itself when it started
    assert where is not None
    pid = where.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        rank0, rank1 = stacks(paths, wait_s=3)
        assert rank0.answered and not rank1.answered
        assert (rank1.state, rank1.pid) == ("stopped", pid)
    finally:
        os.kill(pid, signal.SIGCONT)

    command = shlex.join([sys.executable, "-m", "slurmkit", "attach", paths.run_id, "-p", str(dev_profile),
                          "--rank", "1"])
    term = Terminal("attach", f"cd {shlex.quote(str(paths.run_dir.parent))} && PATH={shlex.quote(os.environ['PATH'])} "
                              f"{command}; echo ATTACH-ENDED-$?; sleep 60")
    try:
        wait_until(lambda: "attaching to job" in term.screen(), 60, "attach to start", 0.2)
        # Slurm's variables and slurmkit's, where the shell runs, and what it sees of the run; the lines
        # looked for are the answers', not the typed command's (the terminal shows that too).
        term.type('echo "AT=$SLURMD_NODENAME:$SLURM_JOB_ID:$SLURMKIT_RANK:$(pwd)"; '
                  'ls run.json >/dev/null && echo SEES-RUN-JSON; '
                  'echo RANKS=$(pgrep -f -c "slurmkit.worker.rank")')
        at = f"AT={where.host}:{job}:1:{paths.run_dir}"
        wait_until(lambda: any(re.fullmatch(r"RANKS=\d+", ln) for ln in term.lines()), 60, "the shell's answer", 0.2)
        lines = term.lines()
        assert at in lines and "SEES-RUN-JSON" in lines, lines
        ranks_seen = int(next(ln for ln in lines if re.fullmatch(r"RANKS=\d+", ln))[len("RANKS="):])
        assert ranks_seen >= 1, lines  # the job's rank processes (the nodes share this machine's /proc)
        term.type("exit")
        wait_until(lambda: "ATTACH-ENDED-0" in term.screen(), 30, "attach to end when its shell exits", 0.2)
    finally:
        term.close()
    assert steps_done(paths)[-1] > before  # the run went on throughout


def test_attach_to_a_run_that_is_not_running_is_one_line(cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    from tests.conftest import write_spec

    spec = write_spec(tmp_path, name="done", command="true")
    ran = CliRunner().invoke(app, ["submit", str(spec), "-p", str(dev_profile), "--wait", "--json"])
    assert ran.exit_code == 0, ran.output
    run_id = json.loads(ran.stdout)["run_id"]
    shown = CliRunner().invoke(app, ["attach", run_id, "-p", str(dev_profile)])
    assert shown.exit_code == 2 and "Traceback" not in shown.output
    assert len(shown.output.strip().splitlines()) == 1


@pytest.mark.parametrize("container", [None, "apptainer"])
def test_shell_is_an_allocation_with_the_profiles_setup_ended_by_exit(cluster: None, tmp_path: Path,
                                                                       run_root: Path, container: str | None) -> None:
    """`slurmkit shell`, typed into a terminal: salloc, then a shell on the allocation's node with the
    profile's variables (a value that would run a command, if it were not quoted, among them);
    `exit` ends the shell and the allocation, and its rc file's folder is gone. With a container
    (the stand-in apptainer, tests/standins), the shell runs through the ranks' image."""
    from tests.unit.test_containers import CONTAINERS

    logs = tmp_path / "argv"
    logs.mkdir()
    profile = tmp_path / "shellprof.yaml"
    profile.write_text(yaml.safe_dump({"extends": "devcluster", "run_root": str(run_root),
                                       "setup": {"env": {"PROBE": "from the profile $(echo not run)"}},
                                       **({"container": CONTAINERS[container]} if container else {})}))
    command = shlex.join([sys.executable, "-m", "slurmkit", "shell", "-p", str(profile), "--nodes", "1",
                          "--time", "00:05:00"])
    path = f"{STANDINS}:{os.environ['PATH']}" if container else os.environ["PATH"]
    term = Terminal("shell", f"PATH={shlex.quote(path)} STANDIN_LOG_DIR={shlex.quote(str(logs))} {command}; "
                             "echo SHELL-ENDED-$?; sleep 60")
    try:
        wait_until(lambda: any(ln.startswith("slurmkit: shell on ") for ln in term.lines()), 90, "the shell", 0.2)
        term.type('echo "ON=$SLURMD_NODENAME:$SLURM_JOB_NUM_NODES:$PROBE"')
        wait_until(lambda: any(ln.startswith("ON=node") for ln in term.lines()), 60, "the shell's answer", 0.2)
        (answer,) = [ln for ln in term.lines() if ln.startswith("ON=node")]
        assert re.fullmatch(r"ON=node[12]:1:from the profile \$\(echo not run\)", answer), answer
        job = next(j for j, name in _my_jobs().items() if name == interactive.SHELL_JOB_NAME)
        term.type("exit")
        wait_until(lambda: "SHELL-ENDED-0" in term.lines(), 60, "shell to end with its shell", 0.2)
    finally:
        term.close()
    wait_until(lambda: job not in _my_jobs(), 60, "the allocation to end", 0.5)
    assert not [p for p in run_root.iterdir() if p.name.startswith("shell-")]  # its rc file's folder removed
    if container:  # the shell went through the image, as the ranks' commands do
        argv = (logs / f"{container}.0.argv").read_text().splitlines()
        assert argv[0] == "exec" and CONTAINERS[container]["image"] in argv and argv[-4:-2] == ["bash", "--rcfile"]


def test_attach_to_a_run_in_a_container_opens_the_shell_through_its_image(cluster: None, tmp_path: Path) -> None:
    """A command run in the stand-in apptainer; `slurmkit attach`, typed into a terminal, opens its shell
    through the same image on rank 0's node, in the run folder, and `exit` leaves the run running."""
    from tests.cluster.test_cluster_containers import container_profile
    from tests.conftest import write_spec
    from tests.unit.test_containers import CONTAINERS

    image = CONTAINERS["apptainer"]["image"]
    profile = container_profile(tmp_path, CONTAINERS["apptainer"])
    spec = write_spec(tmp_path, name="boxed", command="sleep 300", resources={"nodes": 1, "tasks_per_node": 1})
    sub = jobs.submit(resolve(spec, str(profile)))
    assert sub.job_id
    paths, logs = RunPaths(Path(sub.run_dir)), tmp_path / "argv"
    term = None
    try:
        wait_until(lambda: RankProcess.read(paths, sub.job_id or "", 0) is not None, 90, "rank 0 to start", 0.2)
        command = shlex.join([sys.executable, "-m", "slurmkit", "attach", str(paths.run_dir), "-p", str(profile)])
        path = f"{STANDINS}:{os.environ['PATH']}"
        term = Terminal("attach-boxed", f"PATH={shlex.quote(path)} STANDIN_LOG_DIR={shlex.quote(str(logs))} "
                                        f"{command}; echo ATTACH-ENDED-$?; sleep 60")
        term.type('echo "IN=$SLURMKIT_CONTAINER_IMAGE:$SLURMKIT_RANK:$(pwd)"')
        wait_until(lambda: any(ln.startswith("IN=/") for ln in term.lines()), 90, "the shell's answer", 0.2)
        (answer,) = [ln for ln in term.lines() if ln.startswith("IN=/")]
        assert answer == f"IN={image}:0:{paths.run_dir}"
        argv = (logs / "apptainer.0.argv").read_text().splitlines()  # the attach's own, over rank 0's
        assert argv[0] == "exec" and image in argv and argv[-2:] == ["bash", "-i"]
        term.type("exit")
        wait_until(lambda: "ATTACH-ENDED-0" in term.lines(), 60, "attach to end", 0.2)
        assert jobs.run_state(paths).state == "RUNNING"
    finally:
        if term is not None:
            term.close()
        subprocess.run(["scancel", sub.job_id], check=False)


def _my_jobs() -> dict[str, str]:
    out = subprocess.run(["squeue", "--me", "-h", "-o", "%i %j"], capture_output=True, text=True, check=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if line.strip())
