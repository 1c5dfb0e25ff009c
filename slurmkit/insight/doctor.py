"""`slurmkit doctor`: is this profile usable from here? Each check is PASS, WARN or FAIL, with the fix.

Checks run in order and later ones are skipped (not failed) when what they need is missing:
no compute-node job is tried while slurmctld is down.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import re
import shlex
import shutil
import subprocess
from dataclasses import asdict, dataclass
from importlib import metadata

from slurmkit.bench import fs as fs_bench
from slurmkit.build import python_command
from slurmkit.common.layout import expand_checkpoint_root, expand_root
from slurmkit.config.resolved import Resolved
from slurmkit.errors import SlurmError, SlurmkitError, squash
from slurmkit.slurm import commands, limits, preflight

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
PROBE_TIMEOUT_S = 90
FS_PROBE_BYTES = 64 * 2**20
SLOW_FS_MBPS = 100.0


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def _slurm(resolved: Resolved) -> list[Check]:
    if shutil.which("scontrol") is None:
        return [Check("slurm", FAIL, "scontrol is not on PATH", "install the Slurm client (slurm-client) on this node")]
    ping = commands.ping()
    if not ping["up"]:
        return [Check("slurm", FAIL, f"slurmctld does not answer: {ping['detail'] or 'no reply'}",
                      "start slurmctld (`slurmkit devcluster up` on the dev cluster) or check SlurmctldHost in "
                      "slurm.conf")]
    out = [Check("slurm", PASS, f"{commands.version()}, controller up"), _accounting()]
    try:
        partition = preflight.check(resolved)
        out.append(Check("partition", PASS, f"'{partition}' accepts {resolved.shape.alloc_nodes} node(s) for "
                                            f"{resolved.resources.time}"))
    except SlurmkitError as exc:
        out.append(Check("partition", FAIL, exc.one_line(), "fix the profile field named above (`slurmkit profiles "
                                                            "show`), or pick a partition from `sinfo -s`"))
    out.append(_share(resolved))
    return out


def _share(resolved: Resolved) -> Check:
    """The QOS a job runs under, its limits, and the user's fairshare (what decides how long it waits)."""
    user = getpass.getuser()
    qos = limits.qos_of(user, resolved.profile.qos)
    share = limits.fairshare(user)
    if qos is None and share is None:
        return Check("qos/fairshare", SKIP, "accounting has no association for you (or no accounting)")
    parts = [f"fairshare {share:.3f}" if share is not None else "fairshare unknown"]
    if qos is not None:
        caps = ", ".join([f"per job {k}<={v}" for k, v in qos.per_job.items()]
                         + [f"per user {k}<={v}" for k, v in qos.per_user.items()]
                         + ([f"MaxWall {qos.max_wall}"] if qos.max_wall else []))
        parts.append(f"QOS '{qos.name}': {caps or 'no TRES or wall-time limits'}")
    return Check("qos/fairshare", PASS, "; ".join(parts))


ACCOUNTING_DEGRADED = ("without it, finished jobs are judged by their run folders: status, result, wait and the "
                       "requeue policy work; end times, goodput, report segments and restart causes from Slurm "
                       "states are unknown")


def _accounting() -> Check:
    """slurmdbd behind sacct: its absence degrades some answers, never a command."""
    try:
        storage = commands.show_config().get("AccountingStorageType", "")
        if storage.endswith("/none"):
            return Check("accounting", WARN, f"AccountingStorageType={storage}: {ACCOUNTING_DEGRADED}",
                         "nothing to fix for slurmkit; ask the admins for slurmdbd if you need those")
        commands.sacct(["1"])
    except SlurmError as exc:
        return Check("accounting", WARN, f"sacct fails ({exc.what}): {ACCOUNTING_DEGRADED}",
                     "check slurmdbd (`sacctmgr show cluster`)")
    return Check("accounting", PASS, f"{storage}, sacct answers")


def _munge() -> Check:
    if shutil.which("munge") is None or shutil.which("unmunge") is None:
        return Check("munge", FAIL, "munge/unmunge not on PATH", "install munge and start munged")
    proc = subprocess.run("munge -n | unmunge", shell=True, capture_output=True, text=True, timeout=20, check=False)
    if proc.returncode != 0 or not re.search(r"^STATUS:\s+Success", proc.stdout, re.MULTILINE):
        detail = squash(proc.stderr or proc.stdout, 200, tail=False)
        return Check("munge", FAIL, f"a credential does not round-trip: {detail}",
                     "start munged (`systemctl start munge`) with the same /etc/munge/munge.key as the nodes")
    return Check("munge", PASS, "credentials round-trip")


RUNTIME_TOOLS = {"apptainer": ["apptainer", "singularity"], "docker": ["docker"]}


def _compute_node(resolved: Resolved) -> list[Check]:
    """A one-task job: the profile's interpreter imports slurmkit and submitit there, and sees the
    runtime; and its distributions against this host's (drift)."""

    c = resolved.profile.container
    tools = RUNTIME_TOOLS.get(c.runtime, []) if c else []
    probe = ("import json, shutil, sys, slurmkit, submitit; from importlib import metadata; "
             f"print(json.dumps({{'python': sys.executable, 'slurmkit': slurmkit.__version__, "
             f"'runtime': next(filter(None, map(shutil.which, {tools!r})), None), "
             f"'dists': {{d.metadata['Name']: d.version for d in metadata.distributions() if d.metadata['Name']}}}}))")
    options = ["-N1", "-n1", "--time=2", "--job-name=slurmkit-doctor"]
    if resolved.profile.partition:
        options.append(f"--partition={resolved.profile.partition}")
    setup = [f"module load {shlex.quote(m)}" for m in resolved.profile.setup.modules]
    if resolved.profile.setup.venv:
        setup.append(f"source {shlex.quote(resolved.profile.setup.venv + '/bin/activate')}")
    command = " && ".join([*setup, f"{python_command(resolved)} -c {shlex.quote(probe)}"])
    try:
        proc = commands.srun_probe(options, command, PROBE_TIMEOUT_S)
    except SlurmError as exc:  # srun missing, or the probe did not finish within PROBE_TIMEOUT_S
        return [Check("compute-node python", FAIL, f"the probe job failed: {exc.what}",
                      "check `squeue` for why it waits (a busy or down partition)")]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        detail = squash(proc.stderr, 240)
        return [Check("compute-node python", FAIL, f"the profile's python fails on a compute node: {detail}",
                      "install slurmkit where compute nodes see it (shared filesystem) and set `python:` or "
                      "`setup.venv` in the profile")]
    info = json.loads(lines[-1])
    if tools and not info.get("runtime"):
        return [Check("container runtime", FAIL, f"{' or '.join(tools)} is not on PATH on the compute node",
                      f"install {tools[0]} on the nodes, or load its module in `setup.modules`")]
    here = {str(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}
    return [Check("compute-node python", PASS, f"{info['python']} imports slurmkit {info['slurmkit']}"
                  + (f"; container runtime at {info['runtime']}" if tools else "")),
            _drift(here, dict(info.get("dists") or {}))]


def drift(here: dict[str, str], there: dict[str, str]) -> list[tuple[str, str | None, str | None]]:
    """The distributions whose versions differ between this host and the ranks' environment:
    (name, version here, version on the nodes; None: not installed), by name."""
    def norm(d: dict[str, str]) -> dict[str, str]:
        return {k.lower().replace("_", "-"): v for k, v in d.items()}

    a, b = norm(here), norm(there)
    return [(name, a.get(name), b.get(name)) for name in sorted(a.keys() | b.keys()) if a.get(name) != b.get(name)]


def _drift(here: dict[str, str], there: dict[str, str]) -> Check:
    found = drift(here, there)
    if not found:
        return Check("package drift", PASS, f"the nodes' {len(there)} distributions are this host's")
    shown = "; ".join(f"{name} {mine or 'missing'} here, {theirs or 'missing'} on the nodes"
                      for name, mine, theirs in found[:5]) + (f"; and {len(found) - 5} more" if len(found) > 5 else "")
    return Check("package drift", WARN, f"{len(found)} distribution(s) differ: {shown}",
                 "install the same versions on both sides (or stage this environment: profile stage.env)")


def _pyxis() -> Check:
    if "--container-image" not in commands.srun_help():
        return Check("container runtime", FAIL, "srun has no --container-image: the pyxis plugin is not loaded",
                     "ask the admins for pyxis (plugstack.conf), or use runtime: apptainer")
    return Check("container runtime", PASS, "pyxis plugin loaded (srun --container-image)")


def _writable(label: str, uri: str) -> Check:
    try:
        result = fs_bench.run(uri, FS_PROBE_BYTES)
    except SlurmkitError as exc:
        return Check(label, FAIL, exc.one_line(), f"create {uri} and make it writable, or change `{label}` "
                                                  "in the profile")
    speed = f"write {result['write_MBps']} MB/s, read {result['read_MBps']} MB/s"
    if "write_vs_dd" in result:
        speed += f" ({result['write_vs_dd']}x of dd)"
    if result["write_MBps"] < SLOW_FS_MBPS:
        return Check(label, WARN, f"writable but slow: {speed}", "checkpoint to a parallel filesystem or object "
                                                                "store (`checkpoint_root`), not a home folder")
    return Check(label, PASS, f"writable, {speed}")


def _nccl(resolved: Resolved) -> Check:
    env = resolved.profile.nccl_env
    gpus = bool(resolved.node_gpus)
    problems = []
    if env.get("NCCL_DEBUG", "").upper() in ("INFO", "TRACE"):
        problems.append(f"NCCL_DEBUG={env['NCCL_DEBUG']} floods the logs of every rank")
    if env.get("NCCL_IB_DISABLE") == "1" and "NCCL_IB_HCA" in env:
        problems.append("NCCL_IB_DISABLE=1 contradicts NCCL_IB_HCA")
    if gpus and resolved.shape.nodes > 1 and "NCCL_SOCKET_IFNAME" not in env:
        problems.append("multi-node GPU jobs without NCCL_SOCKET_IFNAME may pick a slow or wrong interface")
    if problems:
        return Check("nccl", WARN, "; ".join(problems), "adjust `nccl_env` in the profile")
    return Check("nccl", PASS, ", ".join(f"{k}={v}" for k, v in env.items()) or "no NCCL settings (CPU or defaults)")


def run(resolved: Resolved) -> list[Check]:
    checks: list[Check] = []
    if resolved.profile.executor == "slurm":
        checks += _slurm(resolved)
        checks.append(_munge())
        if checks[0].status == PASS:
            checks += _compute_node(resolved)
            if resolved.profile.container and resolved.profile.container.runtime == "pyxis":
                checks.append(_pyxis())
        else:
            checks.append(Check("compute-node python", SKIP, "needs a reachable slurmctld"))
    else:
        checks.append(Check("slurm", SKIP, "local profile: no Slurm needed"))
    root = expand_root(resolved.profile.run_root)
    with contextlib.suppress(OSError):  # the writability check below reports why
        root.mkdir(parents=True, exist_ok=True)
    checks.append(_writable("run_root", str(root)))
    if resolved.profile.checkpoint_root:
        checks.append(_writable("checkpoint_root", expand_checkpoint_root(resolved.profile.checkpoint_root)))
    checks.append(_nccl(resolved))
    return checks


def failed(checks: list[Check]) -> bool:
    return any(c.status == FAIL for c in checks)
