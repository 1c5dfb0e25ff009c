"""The hang watchdog, in a real child process: it must dump stacks, leave its marker and exit 75."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
