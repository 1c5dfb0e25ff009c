"""Shared fixtures. Cluster tests use the real dev cluster that scripts/test.sh starts."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
USER_CODE = ROOT / "tests" / "user_code"
"""Scripts as users write them, each headed by what it stands for."""
LIGHTNING = ["pytorch-lightning==2.6.6", "lightning-utilities==0.15.3", "torchmetrics==1.9.0", "tqdm==4.70.1"]
"""pytorch-lightning and what it needs beyond slurmkit's environment (torch, fsspec, PyYAML), pinned:
installed with --no-deps, the list is what pip resolved for these versions."""
HUGGINGFACE = ["transformers==5.25.0", "accelerate==1.16.0", "huggingface_hub==2.4.0", "hf-xet==1.8.0",
               "httpcore2==2.17.0", "httpx2==2.17.0", "kernels==0.19.1", "psutil==7.2.2", "safetensors==0.8.0",
               "tokenizers==0.23.3", "tqdm==4.70.1", "truststore==0.10.5"]
"""transformers and accelerate and what they need beyond slurmkit's environment (torch, numpy,
requests), pinned as LIGHTNING. transformers 4.57 cannot resume a multi-process CPU run on torch
2.13 (it loads the optimizer with map_location "cpu:0", which torch refuses)."""
EXAMPLES = ROOT / "examples"


def executed_steps(metrics: Path) -> list[int]:
    """Every step a metrics file's records cover, in the order they ran (a recomputed step twice)."""
    from slurmkit.common.metrics import iter_records, steps_of

    return [s for r in iter_records(metrics) if "step" in r for s in range(r["step"] - steps_of(r) + 1, r["step"] + 1)]


def supervisor_events(run_dir: Path, event: str) -> list[dict[str, Any]]:
    """The job's supervisor's records of one kind (state, launch, signal, decision), in order."""
    import json

    path = run_dir / "supervisor.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [e for e in map(json.loads, lines) if e["event"] == event]


def steady(poll_s: float) -> Any:
    """A fixed poll for tests' waits: they end on events, and slurmkit's backing off (meant for
    slurmctld's sake over long waits) would only add seconds to every cluster test."""
    from slurmkit.runs.polling import Poller

    return Poller(first_s=poll_s, max_s=poll_s)


def _cluster_up() -> bool:
    if shutil.which("scontrol") is None:
        return False
    proc = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20, check=False)
    return "UP" in proc.stdout


@pytest.fixture(scope="session")
def cluster() -> None:
    """The real dev cluster: started if needed; skipped loudly only where it cannot start (not root).

    Cluster tests stop and restart daemons: a controller that answers but is not the dev cluster
    this suite starts (another slurm.conf, another ClusterName) is refused, never used."""
    from slurmkit.devcluster import cluster as dc

    if _cluster_up():
        if not dc.is_ours():
            pytest.fail("a Slurm controller answers here, but it is not slurmkit's dev cluster; refusing to run "
                        "cluster tests (they stop and restart daemons) against it")
        return
    if os.geteuid() != 0:
        msg = "DEV CLUSTER CANNOT START: not root; Slurm integration tests are SKIPPED"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        warnings.warn(msg, stacklevel=1)
        pytest.skip(msg)
    try:
        dc.up(2, log=lambda m: print(f"devcluster: {m}", file=sys.stderr))
    except Exception as exc:  # a cluster that fails to start is a failure, never a skip
        pytest.fail(f"dev cluster failed to start: {exc}")


@pytest.fixture(autouse=True)
def login_user(monkeypatch: pytest.MonkeyPatch) -> None:
    """$USER as a login shell sets it: shipped profiles put it in run_root, and an unset variable
    there is an error (runs.expand_vars). Some containers start a root shell without it."""
    if not os.environ.get("USER"):
        import pwd

        monkeypatch.setenv("USER", pwd.getpwuid(os.getuid()).pw_name)


@pytest.fixture(autouse=True)
def own_node_ledger(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test its own state folder, so its node ledger (common.node_ledger) starts empty: the
    blames one test's faults leave never keep another test's jobs off a node. The jobs a test
    submits get it too (sbatch passes the environment on)."""
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    return state


@pytest.fixture
def single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Training in the test process itself: no launcher's rank variables leak in."""
    for key in ("SLURM_PROCID", "SLURM_NTASKS", "SUBMITIT_LOCAL_GLOBALID", "RANK", "WORLD_SIZE",
                "SLURM_RESTART_COUNT", "SLURMKIT_CHECKPOINT_URI"):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture
def run_root(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    root.mkdir()
    return root


def write_dev_profile(path: Path, run_root: Path, **fields: Any) -> Path:
    """The shipped devcluster profile with its own run root, and no standby ranks: each would import
    torch (~4.5 s of CPU) for every job, on a machine of 2 cores the tests already keep busy. The
    tests of the standby turn it on (profile.requeue.standby=true)."""
    path.write_text(yaml.safe_dump({"extends": "devcluster", "run_root": str(run_root),
                                    "requeue": {"standby": False}, **fields}))
    return path


@pytest.fixture
def dev_profile(tmp_path: Path, run_root: Path) -> Path:
    """write_dev_profile's, with this test's own run root."""
    return write_dev_profile(tmp_path / "dev.yaml", run_root)


@pytest.fixture
def local_profile(tmp_path: Path, run_root: Path) -> Path:
    path = tmp_path / "loc.yaml"
    path.write_text(yaml.safe_dump({"extends": "local", "run_root": str(run_root)}))
    return path


@pytest.fixture
def local_once(tmp_path: Path, run_root: Path) -> Path:
    """The local profile with no preemption budget: a stop on the profile's signal ends the run
    rather than start it again (the local rehearsal of a requeue: tests/unit/test_local_rehearsal.py)."""
    path = tmp_path / "once.yaml"
    path.write_text(yaml.safe_dump({"extends": "local", "run_root": str(run_root), "requeue": {"preemption": 0}}))
    return path


def write_spec(tmp_path: Path, *, filename: str = "spec.yaml", **fields: Any) -> Path:
    path = tmp_path / filename
    path.write_text(yaml.safe_dump(fields))
    return path


@pytest.fixture(scope="session")
def s3_server() -> Any:
    """tests/s3_server.py on the loopback address, its AWS_* variables set for the whole session (the
    ranks of a local run inherit them; s3fs caches its client by arguments, not by environment)."""
    from tests.s3_server import serving

    with serving("127.0.0.1") as s3, pytest.MonkeyPatch.context() as mp:
        for key, value in s3.env.items():
            mp.setenv(key, value)
        yield s3


@pytest.fixture(scope="session")
def login_host(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """tests/sshd.py's OpenSSH server on the loopback address, the login host of the remote tests;
    skipped loudly only where it cannot start (not root, no sshd), a failure under CI=true."""
    from tests import sshd

    reason = ("not root" if os.geteuid() != 0 else "no /usr/sbin/sshd (openssh-server)"
              if not Path(sshd.SSHD).exists() else "")
    if reason:
        msg = f"LOGIN HOST (sshd) CANNOT START: {reason}; remote tests are SKIPPED"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        warnings.warn(msg, stacklevel=1)
        pytest.skip(msg)
    with sshd.serving(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture(scope="session")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real interpreter with nothing installed (a fresh venv): torch, ray, s3fs all missing."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return venv / "bin" / "python"


def pip_target(target: Path, packages: list[str]) -> Path:
    """Packages from the package index, installed at test time into a folder of their own that the
    ranks' interpreter reads through PYTHONPATH; --no-deps: torch and the rest stay the environment's."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
                    "--target", str(target), *packages], check=True, timeout=600)
    return target


@pytest.fixture(scope="session")
def lightning(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding pytorch-lightning, from the package index (nothing vendored)."""
    return pip_target(tmp_path_factory.mktemp("lightning"), LIGHTNING)


@pytest.fixture(scope="session")
def huggingface(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding transformers and accelerate, from the package index (nothing vendored)."""
    return pip_target(tmp_path_factory.mktemp("huggingface"), HUGGINGFACE)


def wait_until(predicate: Any, timeout_s: float = 90, what: str = "", poll_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}")


def slow_down(pid: int, until: Callable[[], bool], looks: int = 60) -> bool:
    """Slow a process from outside: stopped 20 ms of every 30 (SIGSTOP/SIGCONT), with a look at
    `until` every 100 cycles (3 s), at most `looks` times; whether `until` came true. A process
    gone meanwhile ends it; the process is left running (SIGCONT) whatever happens."""
    try:
        for _ in range(looks):
            for _ in range(100):
                os.kill(pid, signal.SIGSTOP)
                time.sleep(0.02)
                os.kill(pid, signal.SIGCONT)
                time.sleep(0.01)
            if until():
                return True
    except ProcessLookupError:
        return until()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    return False
