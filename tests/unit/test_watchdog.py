"""The hang watchdog, in a real child process: it must dump stacks, leave its marker and exit 75."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import HangMarker
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


def _startup_child(tmp_path: Path, mode: str, sleep_s: str, timeout_s: str = "1") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLURMKIT_RUN_DIR": str(tmp_path), "RANK": "3", "SLURMKIT_STARTUP_TIMEOUT_S": timeout_s}
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
