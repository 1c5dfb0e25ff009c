"""The neutral module both sides share (slurmkit.common), and the ownership rules that keep the
house's claims true: only slurm/ and devcluster/ run Slurm binaries, the login side imports no
worker module at import time, common/ imports neither side."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from slurmkit.common import ports
from slurmkit.common.slurm_env import expand_hostlist
from tests.conftest import ROOT

PACKAGE = ROOT / "slurmkit"
SLURM_BINARIES = {"sbatch", "srun", "salloc", "scontrol", "squeue", "sacct", "scancel", "sinfo", "sstat", "sprio",
                  "sshare", "sacctmgr", "sreport", "sattach", "sbcast", "strigger", "sdiag"}
HOSTLISTS = {
    "node1": ["node1"],
    "node[1-3,7],gpu-a[01-02]": ["node1", "node2", "node3", "node7", "gpu-a01", "gpu-a02"],
    "r[1-2]n[01-02]": ["r1n01", "r1n02", "r2n01", "r2n02"],
    "a,b,c[9-11]": ["a", "b", "c9", "c10", "c11"],
    "n[08-10]": ["n08", "n09", "n10"],
    "node1, node[2-3]": ["node1", "node2", "node3"],  # blanks, as a profile's `exclude` may hold them
    "": [],
}


@pytest.mark.parametrize("hostlist", list(HOSTLISTS))
def test_hostlist_expansion(hostlist: str) -> None:
    assert expand_hostlist(hostlist) == HOSTLISTS[hostlist]


@pytest.mark.parametrize("bad", ["n[1-", "n]1[", "n[a-b]", "n[3-1]"])
def test_bad_hostlists_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        expand_hostlist(bad)


@pytest.mark.cluster
def test_hostlist_expansion_matches_scontrol(cluster: None) -> None:
    for hostlist, expected in HOSTLISTS.items():
        if hostlist:
            out = subprocess.run(["scontrol", "show", "hostnames", hostlist], capture_output=True, text=True,
                                 check=True, timeout=30).stdout.split()
            assert out == expected


def test_port_ranges_never_meet() -> None:
    ray_base, blocks, size = ports.RAY
    ranges = [range(ports.TRAINING[0], sum(ports.TRAINING)), range(ports.HEALTH[0], sum(ports.HEALTH)),
              range(ray_base, ray_base + blocks * size)]
    for i, a in enumerate(ranges):
        for b in ranges[i + 1:]:
            assert not set(a) & set(b)
    # Not where outgoing connections take their ports (this machine's range too), nor Ray's own.
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert all(r.stop <= min(low, ports.EPHEMERAL_LOW) for r in ranges)
    assert not {6379, 8265, 10001} & {p for r in ranges for p in r}
    for job_id in ("0", "4999", "5000", "123456", "77_3"):
        picked = {ports.training_port(job_id), ports.health_port(job_id)}
        assert len(picked) == 2 and all(any(p in r for r in ranges[:2]) for p in picked)
    bash = shutil.which("bash")
    assert bash
    out = subprocess.run([bash, "-c", f"SLURM_JOB_ID=123456; echo {ports.ray_port_shell()}"], capture_output=True,
                         text=True, check=True).stdout
    assert int(out) in ranges[2] and int(out) + size - 1 in ranges[2]


def _modules(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def _relative(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _invocations(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a program is named as argv[0]: a list literal that starts with a string, or the string
    handed to a subprocess/os call."""
    found = []
    for node in ast.walk(tree):
        first = None
        if isinstance(node, ast.List) and node.elts and isinstance(node.elts[0], ast.Constant):
            first = node.elts[0].value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and isinstance(node.func.value, ast.Name) and node.func.value.id in ("subprocess", "os")
              and node.args and isinstance(node.args[0], ast.Constant)):
            first = node.args[0].value
        if isinstance(first, str) and first.split():
            found.append((getattr(node, "lineno", 0), first.split()[0]))
    return found


def test_only_slurm_and_devcluster_run_slurm_binaries() -> None:
    offenders = []
    for path in _modules(PACKAGE):
        if _relative(path).startswith(("slurm/", "devcluster/")):
            continue
        offenders += [f"{_relative(path)}:{line}: {prog}" for line, prog in _invocations(ast.parse(path.read_text()))
                      if prog in SLURM_BINARIES]
    assert offenders == []
    # The check sees what it looks for: commands.py names them all through its one runner.
    found = {prog for _, prog in _invocations(ast.parse((PACKAGE / "slurm/commands.py").read_text()))}
    assert {"scontrol", "squeue", "sacct", "scancel", "sinfo", "srun"} <= found  # sbatch: executor.py, via timeout


def _top_level_imports(path: Path) -> set[str]:
    """Modules imported when `path` is imported (not inside functions)."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


# `import slurmkit.distributed` (and .checkpoint, .tracking): the worker's modules under their documented
# names, imported only by code that runs in the job (the login side reaches them lazily, never these files).
PUBLIC_JOB_NAMES = ("distributed.py", "checkpoint.py", "tracking.py", "huggingface.py")


def test_login_side_imports_no_worker_module_and_common_imports_neither_side() -> None:
    for path in _modules(PACKAGE):
        rel = _relative(path)
        if rel.startswith("worker/") or rel in PUBLIC_JOB_NAMES:
            continue
        imported = _top_level_imports(path)
        assert not {m for m in imported if m.startswith("slurmkit.worker")}, rel
        if rel.startswith("common/"):
            assert not {m for m in imported if m.startswith(("slurmkit.cli", "slurmkit.slurm", "slurmkit.runs.jobs",
                                                             "slurmkit.runs.registry", "torch"))}, rel


JOB_SIDE_ALLOWED = ("slurmkit.worker", "slurmkit.supervisor", "slurmkit.common", "slurmkit.config", "slurmkit.slurm",
                    "slurmkit.errors", "slurmkit.trust", "slurmkit.calls", "slurmkit.jsontypes")
JOB_SIDE = ("worker/", "supervisor/")
RANKS_STAND_IN_FOR_THE_SUPERVISOR = {
    # Rank 0 asks the one policy where no supervisor process is there to: a warm restart inside the
    # ranks' processes, and the local profile's requeue; each start records its restart entry; a
    # command's runner shares the supervisor's signal inbox.
    ("worker/train/incarnation.py", "slurmkit.supervisor"),
    ("worker/train/incarnation.py", "slurmkit.supervisor.decision"),
    ("worker/train/warm.py", "slurmkit.supervisor.decision"),
    ("worker/interrupt.py", "slurmkit.supervisor.local_requeue"),
    ("worker/entry.py", "slurmkit.supervisor"), ("worker/command.py", "slurmkit.supervisor.signal_inbox"),
}
CLIENT_MAY_IMPORT = {
    # The callables submitit pickles (the first of the three meeting points) load the job's side
    # when a rank calls them, never where the client builds them.
    ("calls.py", "slurmkit.worker.entry"), ("calls.py", "slurmkit.worker.sweep_task"),
    # `slurmkit bench` measures the job side's own code: the all-reduce runs as a job, `bench fs`
    # writes through the checkpoint store.
    ("bench/allreduce.py", "slurmkit.worker.process_group"), ("bench/fs.py", "slurmkit.worker.checkpoint.store"),
    ("huggingface.py", "slurmkit.worker.frameworks.huggingface"),
    *((name, module) for name in PUBLIC_JOB_NAMES
      for module in ("slurmkit.worker", f"slurmkit.worker.{name.removesuffix('.py')}")),
}


def _all_slurmkit_imports(path: Path) -> set[str]:
    """slurmkit modules `path` imports, at the top or inside functions (`from slurmkit import x` as slurmkit.x)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("slurmkit"):
            found |= {f"slurmkit.{a.name}" for a in node.names} if node.module == "slurmkit" else {node.module}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("slurmkit")}
    return found


def test_the_job_side_and_the_client_meet_only_where_the_design_says() -> None:
    """worker/ and supervisor/ import only the job's side, common/, config/, errors, trust, calls and
    the Slurm client, lazily or not; supervisor/ imports nothing of worker/, and worker/ imports
    supervisor/ only where rank 0 stands in for it; the client imports the job side only at the
    meeting points listed in CLIENT_MAY_IMPORT."""
    job_side, supervisor, ranks, client = [], [], [], []
    for path in _modules(PACKAGE):
        rel = _relative(path)
        for module in sorted(_all_slurmkit_imports(path)):
            if rel.startswith(JOB_SIDE) and not module.startswith(JOB_SIDE_ALLOWED):
                job_side.append(f"{rel}: {module}")
            if rel.startswith("supervisor/") and module.startswith("slurmkit.worker"):
                supervisor.append(f"{rel}: {module}")
            if rel.startswith("worker/") and module.startswith("slurmkit.supervisor") \
                    and (rel, module) not in RANKS_STAND_IN_FOR_THE_SUPERVISOR:
                ranks.append(f"{rel}: {module}")
            if not rel.startswith(JOB_SIDE) and rel != "__init__.py" \
                    and module.startswith(("slurmkit.worker", "slurmkit.supervisor")) \
                    and (rel, module) not in CLIENT_MAY_IMPORT:
                client.append(f"{rel}: {module}")
    assert (job_side, supervisor, ranks, client) == ([], [], [], [])
    # The check sees what it looks for.
    assert "slurmkit.supervisor" in _all_slurmkit_imports(PACKAGE / "supervisor/loop.py")
    assert "slurmkit.supervisor.local_requeue" in _all_slurmkit_imports(PACKAGE / "worker/interrupt.py")
    assert "slurmkit.worker.entry" in _all_slurmkit_imports(PACKAGE / "calls.py")


WORKER_MODULES_AT_SUBMIT = 5


def test_submitting_a_function_loads_at_most_five_worker_modules(tmp_path: Path) -> None:
    """The login process that submits a function (and waits for its result) loads at most
    WORKER_MODULES_AT_SUBMIT of slurmkit.worker's modules: the pickled callable is a small record in
    common/ that loads the job's side only where a rank calls it."""
    profile = tmp_path / "loc.yaml"
    profile.write_text(f"extends: local\nrun_root: {tmp_path / 'runs'}\n")
    code = ("import json, sys\nimport slurmkit\n"
            f"job = slurmkit.Executor(profile={str(profile)!r}, time='00:05:00').submit(pow, 2, 10)\n"
            "value = job.result()\n"
            "print(json.dumps([value, sorted(m for m in sys.modules if m.startswith('slurmkit.worker'))]))\n")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    value, loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert value == 1024  # the function ran, on its rank, through the pickled record
    assert len(loaded) <= WORKER_MODULES_AT_SUBMIT, loaded


def test_slurm_call_counts_are_bounded_and_scoped() -> None:
    from slurmkit.errors import SlurmError
    from slurmkit.slurm import commands

    with commands.counting() as calls:
        for _ in range(500):
            with pytest.raises(SlurmError, match="not found on PATH"):
                commands.call(["sinfo-not-installed"])
    assert calls == {"sinfo-not-installed": 500}
    assert commands.CALLS["sinfo-not-installed"] >= 500 and len(commands.CALLS) < 50  # one counter per program


def _imports_of(path: Path, modules: set[str]) -> set[str]:
    """slurmkit modules `path` imports, at the top or inside functions (not those for the type
    checker only, under `if TYPE_CHECKING:`, which never run)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
                   for stmt in block.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("slurmkit"):
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found & modules


def test_no_import_cycle_even_through_lazy_imports() -> None:
    names = {}
    for path in _modules(PACKAGE):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {name: _imports_of(path, set(names)) - {name} for name, path in names.items()}
    assert "slurmkit.runs.registry" in graph["slurmkit.runs.jobs.submit"]  # the graph sees imports at all
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError(" -> ".join([*trail[trail.index(nxt):], nxt]))
            if nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_a_slurm_conf_not_written_by_devcluster_is_not_ours(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmkit.devcluster import cluster, names

    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=production\nSlurmctldHost=head01\n")
    monkeypatch.setattr(names, "SLURM_CONF", conf)
    assert not cluster.is_ours()
    monkeypatch.setattr(names, "SLURM_CONF", tmp_path / "missing.conf")
    assert not cluster.is_ours()


@pytest.mark.parametrize("durable", [True, False])
def test_atomic_write_replaces_whole_files_and_leaves_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              durable: bool) -> None:
    """Both modes replace the file whole; only the durable one fsyncs (the file and its folder)."""
    import os as os_mod

    from slurmkit.common import atomic

    synced: list[int] = []
    real_fsync = os_mod.fsync

    def counting_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(atomic.os, "fsync", counting_fsync)
    target = tmp_path / "f.txt"
    atomic.atomic_write_text(target, "old\n", durable=durable)
    atomic.atomic_write_text(target, "new\n" * 1000, durable=durable)
    assert target.read_text() == "new\n" * 1000
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]
    assert len(synced) == (4 if durable else 0)


def test_what_a_run_runs_is_one_typed_kind_for_each_kind_of_spec() -> None:
    """The pickled Run carries a tagged union (common.work.Work), not a spec dict read with .get:
    each of config.runspec.KINDS maps to its own type, with its fields."""
    import typing

    from slurmkit.common.work import PythonFunction, RayDriver, ShellCommand, Target, TrainTask, Work, work_of
    from slurmkit.config.runspec import KINDS, RunSpec

    specs: dict[str, dict[str, Any]] = {
        "command": {"command": "true"}, "callable": {"callable": "m:f", "kwargs": {"a": 1}},
        "function": {"function": "__main__.f"}, "task": {"task": "train", "config": {"steps": 3}},
        "ray": {"ray": {"driver": "d.py"}}}
    assert set(specs) == set(KINDS)
    works = {kind: work_of(RunSpec(name="x", **fields), pow, (2, 3)) for kind, fields in specs.items()}
    assert works == {"command": ShellCommand("true"), "callable": Target("m:f", {"a": 1}),
                     "function": PythonFunction(pow, (2, 3), {}), "task": TrainTask("train", {"steps": 3}),
                     "ray": RayDriver(RunSpec(name="x", ray={"driver": "d.py"}).ray.model_dump())}  # type: ignore[union-attr]
    assert {type(w) for w in works.values()} == set(typing.get_args(Work))


def test_config_is_pure_data_and_imports_nothing_of_slurmkit_outside_itself() -> None:
    """config/ is the bottom floor: its models import only each other (lazily or not); reading files
    (trust), finding the shipped profiles (resources) and loading are slurmkit.load's."""
    outside = sorted(f"{_relative(path)}: {module}" for path in _modules(PACKAGE / "config")
                     for module in _all_slurmkit_imports(path) if not module.startswith("slurmkit.config"))
    assert outside == []
    assert "slurmkit.trust" in _all_slurmkit_imports(PACKAGE / "load" / "yamlio.py")  # the check sees imports
