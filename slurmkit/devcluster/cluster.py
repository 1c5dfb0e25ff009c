"""`slurmkit devcluster up | down | status`: start and stop the daemons, by pid, in order.

Order matters: munged, mariadb, slurmdbd (so sacct works), slurmctld, then one slurmd per node
in its own network + UTS namespace. Everything `up` starts is recorded in daemons.json, and
`down` stops exactly that.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurmkit.common.atomic import atomic_write_text
from slurmkit.devcluster import names, network
from slurmkit.errors import DevClusterError, SlurmError, squash
from slurmkit.jsontypes import JsonObject
from slurmkit.runs.procs import pid_alive
from slurmkit.slurm import commands

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge", "slurmdbd", "mariadb-server", "iproute2"]
BINARIES = ["slurmctld", "slurmd", "sbatch", "munged", "slurmdbd", "mariadbd", "ip", "nsenter"]
DAEMONS_FILE = names.STATE_DIR / "daemons.json"
Log = Callable[[str], None]


def sh(argv: list[str], timeout: float = 60, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kw)
    except subprocess.TimeoutExpired as exc:
        raise DevClusterError(f"{argv[0]} timed out after {timeout:.0f} s") from exc
    if check and proc.returncode != 0:
        raise DevClusterError(f"{' '.join(argv[:3])} failed: {squash(proc.stderr or proc.stdout, 300, tail=False)}")
    return proc


def require_root() -> None:
    if os.geteuid() != 0:
        raise DevClusterError("the dev cluster needs root (it installs packages, creates network "
                              "namespaces and runs slurmctld/slurmd)", valid="run it as root, e.g. with sudo")


def ensure_packages(log: Log) -> None:
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if not missing:
        return
    log(f"installing {' '.join(PACKAGES)} (missing: {', '.join(missing)})")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    sh(["apt-get", "update", "-qq"], timeout=600, env=env)
    sh(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES], timeout=900, env=env)


def _load() -> JsonObject:
    try:
        data: JsonObject = json.loads(DAEMONS_FILE.read_text())
        return data
    except (FileNotFoundError, json.JSONDecodeError):
        return {"nodes": 0, "daemons": {}}


def _save(state: JsonObject) -> None:
    atomic_write_text(DAEMONS_FILE, json.dumps(state, indent=2) + "\n")


def program(name: str) -> str:
    """The binary a recorded daemon name runs (slurmd-node1 -> slurmd)."""
    return {"mariadb": "mariadbd"}.get(name, name.split("-", 1)[0])


def ours(name: str, pid: int | None) -> bool:
    """Alive and still the daemon we started: a recorded pid may have been reused since."""
    if not pid_alive(pid):
        return False
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        return False
    return Path(argv0).name in (program(name), "nsenter", "unshare", "sh")


def _spawn(name: str, argv: list[str], **kw: Any) -> int:
    names.LOG_DIR.mkdir(parents=True, exist_ok=True)
    with open(names.LOG_DIR / f"{name}.console.log", "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, **kw)
    return proc.pid


def _wait_for(what: str, ok: Callable[[], bool], timeout: float, pid: int | None = None, log_name: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        if pid is not None and not pid_alive(pid):
            break
        time.sleep(0.3)
    hint = f"; see {names.LOG_DIR / log_name}" if log_name else ""
    raise DevClusterError(f"{what} did not come up within {timeout:.0f} s{hint}")


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _munge_ok() -> bool:
    enc = subprocess.run(["munge", "-n"], capture_output=True, timeout=10, check=False)
    if enc.returncode != 0:
        return False
    dec = subprocess.run(["unmunge"], input=enc.stdout, capture_output=True, timeout=10, check=False)
    return dec.returncode == 0


def _mariadb_ok() -> bool:
    return sh(["mariadb", "-e", "select 1"], timeout=10, check=False).returncode == 0


def _start_munge(state: JsonObject, log: Log) -> None:
    if _munge_ok():
        return
    log("starting munged")
    run = Path("/run/munge")
    run.mkdir(parents=True, exist_ok=True)
    shutil.chown(run, "munge", "munge")
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        sh(["mungekey", "--create", "--keyfile", str(key)])
    shutil.chown(key, "munge", "munge")
    key.chmod(0o400)
    pid = _spawn("munged", ["munged", "--foreground"], user="munge", group="munge")
    state["daemons"]["munged"] = pid
    _wait_for("munged", _munge_ok, 20, pid, "munged.console.log")


def _start_mariadb(state: JsonObject, log: Log, purge: bool) -> None:
    if not _mariadb_ok():
        log("starting mariadb")
        run = Path("/run/mysqld")
        run.mkdir(parents=True, exist_ok=True)
        shutil.chown(run, "mysql", "mysql")
        pid = _spawn("mariadb", ["mariadbd", "--user=mysql", "--bind-address=127.0.0.1",
                                 "--socket=/run/mysqld/mysqld.sock"])
        state["daemons"]["mariadb"] = pid
        _wait_for("mariadb", _mariadb_ok, 60, pid, "mariadb.console.log")
    sql = ""
    if purge:
        sql += f"DROP DATABASE IF EXISTS {names.DB_NAME}; "
    sql += (f"CREATE USER IF NOT EXISTS '{names.DB_USER}'@'localhost' IDENTIFIED BY '{names.DB_PASS}'; "
            f"GRANT ALL ON {names.DB_NAME}.* TO '{names.DB_USER}'@'localhost'; FLUSH PRIVILEGES;")
    sh(["mariadb", "-e", sql], timeout=30)


def _start_daemon(state: JsonObject, name: str, argv: list[str], ready: Callable[[], bool],
                  log: Log, timeout: float = 60) -> None:
    if ours(name, state["daemons"].get(name)):
        return
    log(f"starting {name}")
    pid = _spawn(name, argv)
    state["daemons"][name] = pid
    _save(state)
    _wait_for(name, ready, timeout, pid, f"{name}.console.log")


def _ctld_up() -> bool:
    try:
        return bool(commands.ping()["up"])
    except SlurmError:
        return False


def _node_states() -> dict[str, str]:
    try:
        out = commands.run(["sinfo", "--noheader", "--Node", "--format=%N %t"], timeout=10)
    except SlurmError:
        return {}
    return dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)


def _wait_idle(n: int, log: Log, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    resumed: set[str] = set()
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = _node_states()
        want = [nd.name for nd in names.nodes(n)]
        for name in want:
            st = states.get(name, "").rstrip("*~#!%$@^-")
            if st in ("down", "drain", "drained", "draining", "fail") and name not in resumed:
                log(f"resuming {name} ({st})")
                commands.run(["scontrol", "update", f"NodeName={name}", "State=RESUME"], check=False)
                resumed.add(name)
        if all(states.get(name, "").rstrip("*~#!%$@^-") in ("idle", "mix", "alloc") for name in want):
            return
        time.sleep(0.5)
    raise DevClusterError(f"nodes not idle after {timeout:.0f} s: {states}", valid=f"see {names.LOG_DIR}")


def up(n: int = 2, purge: bool = False, log: Log = print, variant: names.Variant = names.DEFAULT) -> JsonObject:
    """Bring the cluster up with n nodes as `variant` says; a second call with the same ones changes
    nothing, other ones restart the daemons (slurmctld reads MaxJobCount only when it starts).
    Without accounting no mariadb or slurmdbd runs: sacct has nothing to ask, as on clusters
    without them. GPUs declared as GRES are backed by stand-in device files (there are no GPUs here)."""
    require_root()
    v = variant
    _check(n, v)
    ensure_packages(log)
    state = _load()
    conf = names.slurm_conf(n, v)
    reconfigured = names.SLURM_CONF.exists() and names.SLURM_CONF.read_text() != conf and bool(state["daemons"])
    if purge or (state["nodes"] and state["nodes"] != n) or reconfigured:
        down(purge=purge, log=log)
        state = _load()
    for d in (names.STATE_DIR, names.RUN_DIR, names.LOG_DIR, names.STATE_DIR / "ctld", names.SLURM_CONF.parent):
        d.mkdir(parents=True, exist_ok=True)
    state["nodes"] = n
    _write_if_changed(names.SLURM_CONF, conf, 0o644)
    _write_if_changed(names.SLURMDBD_CONF, names.slurmdbd_conf(), 0o600)
    if v.gpus_per_node:
        _gpu_devices(v.gpus_per_node)
        _write_if_changed(names.GRES_CONF, names.gres_conf(n, v.gpus_per_node), 0o644)
    else:
        names.GRES_CONF.unlink(missing_ok=True)
    network.setup(names.nodes(n))
    network.write_hosts(names.hosts_block(n))
    _start_munge(state, log)
    if v.accounting:
        _start_mariadb(state, log, purge)
        _save(state)
        _start_daemon(state, "slurmdbd", ["slurmdbd", "-D"], lambda: _port_open("127.0.0.1", 6819), log)
    _start_daemon(state, "slurmctld", ["slurmctld", "-D", "-i"], _ctld_up, log)
    _start_slurmds(state, n, log)
    _save(state)
    _wait_idle(n, log)
    extras = [text for on, text in ((not v.accounting, "no accounting"),
                                    (v.gpus_per_node, f"{v.gpus_per_node} GPUs a node"),
                                    (v.preempt_user_signal, "the user signal on preemption")) if on]
    log(f"dev cluster up: {n} nodes idle in partition {names.PARTITION}" + "".join(f", {e}" for e in extras))
    return status()


def _check(n: int, v: names.Variant) -> None:
    if n < 2:
        raise DevClusterError(f"--nodes {n} is too few", valid="valid: 2 or more")
    if not 2 <= v.max_array_size <= 4_000_001 or v.max_job_count < max(v.max_array_size, 2):
        raise DevClusterError(f"--max-array-size {v.max_array_size} with --max-job-count {v.max_job_count}",
                              valid="valid: 2 <= max-array-size <= 4000001 (Slurm's bound), max-job-count >= it")
    if v.min_job_age_s < 2:
        raise DevClusterError(f"--min-job-age {v.min_job_age_s} is too short", valid="valid: 2 s or more")
    if not 0 <= v.gpus_per_node <= 16:
        raise DevClusterError(f"--gpus-per-node {v.gpus_per_node}", valid="valid: 0 to 16")


def _start_slurmds(state: JsonObject, n: int, log: Log) -> None:
    for nd in names.nodes(n):
        (names.STATE_DIR / f"slurmd-{nd.name}").mkdir(exist_ok=True)
        # nsenter, not `ip netns exec`: the latter remounts /sys and slurmd then fails its cgroup init.
        # Each node's own local disk, as a real node has: a folder of its own mounted at NODE_LOCAL in
        # a mount namespace of its own, which every job step started by this slurmd inherits.
        local = names.STATE_DIR / f"local-{nd.name}"
        local.mkdir(mode=0o755, exist_ok=True)
        names.NODE_LOCAL.mkdir(mode=0o755, exist_ok=True)
        argv = ["nsenter", f"--net=/run/netns/{nd.netns}", "unshare", "--uts", "--mount", "--propagation", "private",
                "sh", "-c", f'mount --bind {local} {names.NODE_LOCAL} && hostname {nd.name} && '
                            f'exec slurmd -D -N {nd.name}']
        _start_daemon(state, f"slurmd-{nd.name}", argv, lambda: True, log)


def _gpu_devices(count: int) -> None:
    """Character devices with NVIDIA's major number (195), as slurmd insists on for a gres.conf
    File=; nothing opens them: there are no GPUs here, only their allocation."""
    names.GPU_DEVICES.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        dev = names.GPU_DEVICES / f"nvidia{i}"
        if dev.exists() and not dev.is_char_device():
            dev.unlink()
        if not dev.exists():
            os.mknod(dev, stat.S_IFCHR | 0o600, os.makedev(195, i))


def _write_if_changed(path: Path, text: str, mode: int) -> None:
    if not path.exists() or path.read_text() != text:
        atomic_write_text(path, text)
    path.chmod(mode)


def down(purge: bool = False, log: Log = print) -> None:
    """Stop what `up` started, by pid, newest first; --purge also wipes controller state."""
    require_root()
    state = _load()
    for name, pid in reversed(list(state["daemons"].items())):
        if ours(name, pid):
            log(f"stopping {name} (pid {pid})")
            _stop(pid)
    network.teardown(names.nodes(state.get("nodes") or 0))
    network.write_hosts("")
    if purge:
        for d in names.STATE_DIR.glob("*"):
            if d.is_dir():
                shutil.rmtree(d, ignore_errors=True)
        log("purged controller and node state")
    _save({"nodes": 0, "daemons": {}})


def stop_daemon(name: str) -> bool:
    """Stop one recorded daemon (e.g. slurmctld, to see what an outage looks like); `up` starts it again."""
    require_root()
    pid = _load()["daemons"].get(name)
    if not ours(name, pid):
        return False
    _stop(pid)
    return True


def _stop(pid: int, grace_s: float = 10) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.1)
    if pid_alive(pid):
        os.kill(pid, signal.SIGKILL)


def is_ours() -> bool:
    """The controller that answers is the dev cluster `up` started: our slurm.conf, our live slurmctld,
    and the controller reports our ClusterName (tests stop and restart it: never someone else's)."""
    try:
        written = names.SLURM_CONF.read_text().startswith(names.CONF_HEADER)
    except OSError:
        return False
    ctld = _load()["daemons"].get("slurmctld")
    if not written or not ours("slurmctld", ctld):
        return False
    try:
        return commands.show_config().get("ClusterName") == names.CLUSTER_NAME
    except SlurmError:
        return False


def status() -> JsonObject:
    state = _load()
    daemons = {name: {"pid": pid, "alive": ours(name, pid)} for name, pid in state["daemons"].items()}
    return {"nodes": state.get("nodes", 0), "daemons": daemons,
            "controller": _ctld_up() if shutil.which("scontrol") else False, "node_states": _node_states()}
