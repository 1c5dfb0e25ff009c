"""The hang watchdog, in a real child process: it must dump stacks, leave its marker and exit 75."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import HangMarker, StartupWatched, Straggler, Stragglers
from slurmkit.supervisor.watch import GRACE_S, OutsideWatch
from slurmkit.worker.ft.watchdog import FLOOR_S, HANG_EXIT_CODE, auto_timeout

CHILD = """
import json, sys, time
from slurmkit.worker.ft.watchdog import Watchdog
marker = sys.argv[1]
def on_fire(idle):
    open(marker, "w").write(json.dumps({"idle_s": idle}))
wd = Watchdog(float(sys.argv[2]), on_fire, poll_s=0.1).start()
for _ in range(5):
    time.sleep(0.05)
    wd.progress(0.05)
print("steps stopped", flush=True)
time.sleep(60)
"""


def test_watchdog_fires_after_the_timeout(tmp_path: Path) -> None:
    marker = tmp_path / "hang.json"
    # The child would sleep 60 s after its last step: exiting 75 means the watchdog ended it.
    proc = subprocess.run([sys.executable, "-c", CHILD, str(marker), "1.5"], capture_output=True, text=True,
                          timeout=55)
    assert proc.returncode == HANG_EXIT_CODE and "steps stopped" in proc.stdout
    assert "no step progress" in proc.stderr and "Thread" in proc.stderr  # faulthandler's all-thread dump
    idle = json.loads(marker.read_text())["idle_s"]
    assert 1.5 < idle < 60  # fired after the timeout without progress, before the sleep ended


def test_auto_timeout_floor_and_multiple() -> None:
    assert auto_timeout(0.005) == FLOOR_S
    assert auto_timeout(3.0) == 30.0


STARTUP_CHILD = """
import sys, time
from slurmkit.worker.ft.stop import ScriptStop
script = ScriptStop()  # a slurmkit.Checkpoint's or a framework callback's: the startup watch begins
if sys.argv[1] == "steps":
    script.stepped()  # the first step completed
print("waiting", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _startup_child(tmp_path: Path, mode: str, sleep_s: str, timeout_s: str = "1",
                   rank: str = "3") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLURMKIT_RUN_DIR": str(tmp_path), "RANK": rank, "SLURMKIT_STARTUP_TIMEOUT_S": timeout_s,
           "SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1", "SLURMKIT_ATTEMPT": "2"}
    return subprocess.run([sys.executable, "-c", STARTUP_CHILD, mode, sleep_s], capture_output=True, text=True,
                          timeout=120, env=env)


def test_a_rank_with_no_first_step_within_the_startup_timeout_is_a_startup_hang(tmp_path: Path) -> None:
    proc = _startup_child(tmp_path, "never", "60")  # would wait 60 s: exiting 75 means the watch ended it
    assert proc.returncode == HANG_EXIT_CODE, proc.stderr
    assert "Thread" in proc.stderr  # every thread's stack, dumped
    (found,) = HangMarker.take_all(RunPaths(tmp_path))
    assert (found.rank, found.startup) == (3, True)


def test_the_first_step_ends_the_startup_watch_and_zero_turns_it_off(tmp_path: Path) -> None:
    assert _startup_child(tmp_path, "steps", "3").returncode == 0  # past the 1 s timeout, after a step
    assert _startup_child(tmp_path, "never", "3", timeout_s="0").returncode == 0
    assert HangMarker.take_all(RunPaths(tmp_path)) == []


def test_rank_0_records_its_startup_watch_for_the_supervisor_and_other_ranks_do_not(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    assert _startup_child(tmp_path, "never", "0", timeout_s="30", rank="1").returncode == 0
    assert not paths.startup_marker.exists()  # one file a step, not one a rank
    assert _startup_child(tmp_path, "never", "0", timeout_s="30", rank="0").returncode == 0
    begun = StartupWatched.read(paths, "77", 1, 2)
    assert begun is not None and begun.timeout_s == 30 and begun.first_step is None
    assert StartupWatched.read(paths, "77", 1, 3) is None  # another step's record is not this one's
    assert _startup_child(tmp_path, "steps", "0", timeout_s="30", rank="0").returncode == 0
    stepped = StartupWatched.read(paths, "77", 1, 2)
    assert stepped is not None and stepped.first_step is not None and stepped.first_step >= stepped.begun


def test_the_supervisor_sees_a_startup_hang_no_rank_could_report(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """GRACE_S past rank 0's deadline with no first step and no rank's marker: a hang of rank -1;
    not before, not after a first step, not where a rank's own watch has spoken."""
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    paths = RunPaths(tmp_path)
    watch = OutsideWatch(paths, "77", 0, launched=900.0, patience_s=None)
    assert watch.frozen(5000.0) is None  # rank 0 never began a watch: nothing to judge
    StartupWatched("77", 0, 0, begun=1000.0, timeout_s=20.0).write(paths)
    assert watch.frozen(1000.0 + 20 + GRACE_S - 1) is None
    hung = watch.frozen(1000.0 + 20 + GRACE_S + 1)
    assert hung is not None and (hung.rank, hung.startup) == (-1, True)
    HangMarker.now(1, 20.0, startup=True).write(paths)
    assert watch.frozen(5000.0) is None  # rank 1's own watch fired: the ranks speak for themselves
    HangMarker.take_all(paths)
    StartupWatched("77", 0, 0, begun=1000.0, timeout_s=20.0, first_step=1010.0).write(paths)
    assert watch.frozen(5000.0) is None


def test_a_straggler_lasting_its_patience_is_asked_about_once(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    Stragglers([Straggler(1, "node2", 0.3, 800.0), Straggler(3, "node4", 0.4, 1000.0)]).write(paths)
    assert OutsideWatch(paths, "77", 0, 900.0, patience_s=None).lasting(5000.0) is None  # warn: never asked
    watch = OutsideWatch(paths, "77", 0, 900.0, patience_s=60.0)
    assert watch.lasting(1059.0) is None  # node2's was named before this step began; node4's not for long
    found = watch.lasting(1061.0)
    assert found is not None and found.node == "node4"
    assert watch.lasting(5000.0) is None  # asked once


def test_the_standby_ranks_start_once_rank_0s_first_step_is_done(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Not beside the ranks' own start (they would compete for the CPUs and the filesystem while the
    ranks import): at rank 0's first step; a run without a startup watch after STANDBY_UNWATCHED_S;
    any run after STANDBY_LATEST_S."""
    from slurmkit.supervisor.watch import STANDBY_LATEST_S, STANDBY_UNWATCHED_S

    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    paths = RunPaths(tmp_path)
    watch = OutsideWatch(paths, "77", 0, launched=1000.0, patience_s=None)
    assert not watch.standby_due(1000.0 + STANDBY_UNWATCHED_S - 1)
    assert watch.standby_due(1000.0 + STANDBY_UNWATCHED_S)  # no watch: a plain command's ranks
    StartupWatched("77", 0, 0, begun=1001.0, timeout_s=600.0).write(paths)
    assert not watch.standby_due(1000.0 + STANDBY_LATEST_S - 1)  # importing, not yet stepping
    assert watch.standby_due(1000.0 + STANDBY_LATEST_S)
    StartupWatched("77", 0, 0, begun=1001.0, timeout_s=600.0, first_step=1004.0).write(paths)
    assert watch.standby_due(1005.0)
