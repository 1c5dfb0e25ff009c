"""Commands from a laptop over one SSH connection (slurmkit.remote) against the same command on the
login host, in one run on the dev cluster, as root (it makes the laptop user; tests/sshd.py):

- `status` of 1,000 runs: remote / (login host + one round trip), goal <= 1.5;
- `submit` with a 5 MB snapshot: remote / (login host + a raw `ssh cat > file` of the 5 MB), goal <= 1.5.

Each figure is the median of REPEATS. The laptop's own interpreter start is inside the remote
figures (a user pays it), as the login host's is inside the local ones.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RunFile, RunRecord

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests import sshd  # noqa: E402  (the test's login host and laptop user)

N_RUNS = 1000
SNAPSHOT_MB = 5
REPEATS = 5


def timed(fn: Callable[[], object]) -> float:
    samples = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def laptop_ssh_argv(ssh: list[str], lap: sshd.Laptop, server: sshd.Sshd, remote: list[str]) -> list[str]:
    """The ssh line a laptop command uses (its own master's socket, in its home), for `remote`."""
    code = ("import json, sys; from slurmkit.config.login import LoginHost; "
            "from slurmkit.remote.connection import Connection; "
            f"login = LoginHost(host='127.0.0.1', port={server.port}, user='root', identity={str(lap.identity)!r}, "
            f"known_hosts={str(lap.known_hosts)!r}); "
            f"print(json.dumps(Connection(login, 'site').ssh_argv({remote!r})))")
    out = subprocess.run([*ssh, str(lap.python), "-P", "-c", code], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    return list(json.loads(out))


def ok(done: subprocess.CompletedProcess[str]) -> None:
    if done.returncode != 0:
        raise SystemExit(f"failed: {done.args}\n{done.stderr}")


def main() -> None:
    array = subprocess.run(["sbatch", "--parsable", f"--array=0-{N_RUNS - 1}", "--output=/dev/null", "--wrap",
                            "sleep 120"], capture_output=True, text=True, check=True, timeout=60).stdout
    array_id = array.strip().split(";")[0]
    tmp = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    try:
        runs = tmp / "runs"
        for i in range(N_RUNS):
            paths = RunPaths(runs / f"task-{i:04d}")
            RunFile(paths).create(RunRecord(run_id=paths.run_id, run_dir=str(paths.run_dir), executor="slurm",
                                            job_ids=[f"{array_id}_{i}"], num_tasks=1))
        with sshd.serving(tmp / "sshd") as server, sshd.laptop(server, "skbench", tmp / "wheel") as lap:
            site = lap.profile("site", server, extends="devcluster", run_root=str(runs))
            here = tmp / "here.yaml"
            here.write_text(yaml.safe_dump({"extends": "devcluster", "run_root": str(runs)}))
            ok(lap.slurmkit("connect", "-p", str(site)))
            py = [sys.executable, "-P", "-m", "slurmkit"]
            # One round trip through the master, as the laptop user (runuser's cost on both sides).
            ssh = ["runuser", "-u", lap.user, "--", "env", "-i", *(f"{k}={v}" for k, v in lap.env().items())]
            rtt_argv = [*ssh, *laptop_ssh_argv(ssh, lap, server, ["true"])]
            rtt = timed(lambda: subprocess.run(rtt_argv, check=True, timeout=60))
            status_here = timed(lambda: ok(subprocess.run([*py, "status", "-p", str(here), "--json"],
                                                          capture_output=True, text=True, timeout=300)))
            status_remote = timed(lambda: ok(lap.slurmkit("status", "-p", str(site), "--json")))

            code = lap.home / "project"
            blob = lap.write("project/data.bin", "")
            blob.write_bytes(os.urandom(SNAPSHOT_MB << 20))
            spec = lap.write("project/run.yaml", "name: snap\ncommand: 'true'\nsnapshot: true\n")
            os.chown(blob, lap.home.stat().st_uid, lap.home.stat().st_gid)
            copy = tmp / "project"
            shutil.copytree(code, copy)
            cat_argv = [*ssh, *laptop_ssh_argv(ssh, lap, server, ["sh", "-c", f"cat > {tmp / 'raw.bin'}"])]

            def raw_cat() -> None:
                with blob.open("rb") as f:
                    subprocess.run(cat_argv, stdin=f, check=True, timeout=300)

            transfer = timed(raw_cat)
            submit_here = timed(lambda: ok(subprocess.run([*py, "submit", "run.yaml", "-p", str(here)], cwd=copy,
                                                          capture_output=True, text=True, timeout=300)))
            submit_remote = timed(lambda: ok(lap.slurmkit("submit", str(spec.name), "-p", str(site), cwd=code)))
            print(json.dumps({
                "runs": N_RUNS, "round_trip_s": round(rtt, 3),
                "status_login_host_s": round(status_here, 3), "status_remote_s": round(status_remote, 3),
                "status_ratio": round(status_remote / (status_here + rtt), 2), "status_goal": "<= 1.5",
                "snapshot_mb": SNAPSHOT_MB, "raw_transfer_s": round(transfer, 3),
                "submit_login_host_s": round(submit_here, 3), "submit_remote_s": round(submit_remote, 3),
                "submit_ratio": round(submit_remote / (submit_here + transfer), 2), "submit_goal": "<= 1.5",
            }))
    finally:
        subprocess.run(["scancel", array_id], check=False, timeout=60)
        subprocess.run(["scancel", "--name", "snap"], check=False, timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
