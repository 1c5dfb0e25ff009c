"""Staging the environment (profile stage.env, docs/staging.md) without Slurm: its identity, the
image and its checksum, the node's bash that unpacks it (run here, as each node runs it), and the
batch script that stages before the supervisor starts. The broadcast and the nodes' own disks are
tests/cluster/test_cluster_staging.py's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from slurmkit.build import SubmitRequest
from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import HealthReport
from slurmkit.common.supervisor_plan import Plan
from slurmkit.load.loader import resolve
from slurmkit.runs import jobs
from slurmkit.slurm import steps
from slurmkit.stage import envpack
from slurmkit.stage.envpack import StageError
from tests.conftest import EXAMPLES, ROOT

NODE_SCRIPT = ROOT / "templates" / "partials" / "stage_node.sh.j2"


def fake_env(root: Path) -> Path:
    """A small environment: an interpreter link, one distribution, one module."""
    site = root / "lib" / "python3.11" / "site-packages"
    (site / "pkg-1.0.dist-info").mkdir(parents=True)
    (site / "pkg-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n")
    (site / "pkg.py").write_text("X = 1\n")
    (root / "bin").mkdir()
    (root / "bin" / "python").symlink_to("/usr/bin/python3")
    return root


def test_the_identity_follows_the_files_not_their_compiled_caches(tmp_path: Path) -> None:
    env = fake_env(tmp_path / "env")
    first = envpack.identify(tmp_path / "runs", prefix=env)
    assert first.distributions == {"pkg": "1.0"} and first.image.parent == tmp_path / "runs" / envpack.STORE
    cache = env / "lib" / "python3.11" / "site-packages" / "__pycache__"
    cache.mkdir()
    (cache / "pkg.cpython-311.pyc").write_bytes(b"x")  # an import wrote it: the same environment
    assert envpack.identify(tmp_path / "runs", prefix=env).digest == first.digest
    (env / "lib" / "python3.11" / "site-packages" / "pkg.py").write_text("X = 2\n")
    assert envpack.identify(tmp_path / "runs", prefix=env).digest != first.digest


def test_an_editable_install_outside_the_environment_is_refused_slurmkits_own_is_packed(tmp_path: Path) -> None:
    env = fake_env(tmp_path / "env")
    site = env / "lib" / "python3.11" / "site-packages"
    (site / "_own.pth").write_text(str(ROOT) + "\n")  # slurmkit's checkout, as `pip install -e .` leaves it
    img = envpack.identify(tmp_path / "runs", prefix=env)
    assert img.editable == ((ROOT / "slurmkit", "lib/python3.11/site-packages/slurmkit"),)
    assert img.left_out == ("lib/python3.11/site-packages/_own.pth",)
    (tmp_path / "elsewhere").mkdir()
    (site / "other.pth").write_text(str(tmp_path / "elsewhere") + "\n")
    with pytest.raises(StageError) as caught:
        envpack.identify(tmp_path / "runs", prefix=env)
    assert caught.value.where == "profile.stage.env"
    with pytest.raises(StageError):
        envpack.identify(tmp_path / "runs", prefix=Path("/usr"))  # the system's Python is no environment


def _pack(tmp_path: Path) -> envpack.Packed:
    env = fake_env(tmp_path / "env")
    return envpack.pack(envpack.identify(tmp_path / "runs", prefix=env))


def _stage_node(root: Path, packed: envpack.Packed, run_dir: Path, sha: str | None = None,
                max_mb: int = 1024, mode: str = "unpack") -> subprocess.CompletedProcess[str]:
    img = packed.image
    sha = sha or img.sha_file.read_text().strip()
    return subprocess.run(["bash", "-c", f'source "{NODE_SCRIPT}"; slurmkit_stage_node "$@"', "_", mode, str(root),
                           img.digest, sha, str(img.image), str(max_mb), str(run_dir)],
                          capture_output=True, text=True, timeout=120)


def test_a_node_unpacks_the_image_once_and_reuses_it(tmp_path: Path) -> None:
    packed = _pack(tmp_path)
    assert not packed.reused and packed.image.image.stat().st_mode & 0o077 == 0
    again = envpack.pack(packed.image)
    assert again.reused  # unchanged: nothing packed
    run_dir, root = tmp_path / "run", tmp_path / "node" / "stage"
    run_dir.mkdir()
    said = [json.loads(_stage_node(root, packed, run_dir, mode=m).stdout) for m in ("check", "unpack", "check")]
    assert [s["action"] for s in said] == ["want", "unpacked", "reused"]  # a restart's one step: reused
    env = root / f"env-{packed.image.digest}"
    assert (env / "lib" / "python3.11" / "site-packages" / "pkg.py").read_text() == "X = 1\n"
    assert os.readlink(env / "bin" / "python") == "/usr/bin/python3"
    assert root.stat().st_mode & 0o777 == 0o700
    assert not list(root.glob(".incoming-*")) and not list(root.glob(".partial-*"))


def test_a_corrupt_image_is_never_unpacked_and_fails_that_nodes_health(tmp_path: Path) -> None:
    packed = _pack(tmp_path)
    run_dir, root = tmp_path / "run", tmp_path / "node" / "stage"
    run_dir.mkdir()
    proc = _stage_node(root, packed, run_dir, sha="0" * 64)  # the checksum of another image
    assert proc.returncode == 1
    (report,) = HealthReport.take_all(RunPaths(run_dir))
    assert report.problems and report.problems[0].startswith("stage:")
    assert [p.name for p in root.iterdir()] == []  # no copy, no partial one, nothing left to reuse


def test_a_folder_someone_else_could_have_made_is_refused(tmp_path: Path) -> None:
    packed = _pack(tmp_path)
    run_dir, root = tmp_path / "run", tmp_path / "node" / "stage"
    run_dir.mkdir()
    (tmp_path / "theirs").mkdir()
    root.parent.mkdir()
    root.symlink_to(tmp_path / "theirs")
    assert _stage_node(root, packed, run_dir).returncode == 1
    assert len(HealthReport.take_all(RunPaths(run_dir))) == 1 and not list((tmp_path / "theirs").iterdir())


def test_old_copies_go_least_recently_used_first(tmp_path: Path) -> None:
    packed = _pack(tmp_path)
    run_dir, root = tmp_path / "run", tmp_path / "node" / "stage"
    run_dir.mkdir()
    for name, age in (("env-old", 300), ("env-older", 600)):
        (root / name).mkdir(parents=True)
        (root / name / "blob").write_bytes(os.urandom(1 << 20))
        (root / name / ".ready").touch()
        os.utime(root / name / ".ready", (1e9 - age, 1e9 - age))
    root.chmod(0o700)
    assert json.loads(_stage_node(root, packed, run_dir, max_mb=2).stdout)["action"] == "unpacked"
    assert sorted(p.name for p in root.iterdir()) == sorted(["env-old", f"env-{packed.image.digest}"])


def staged_request(*sets: str) -> SubmitRequest:
    return jobs.dry_run(resolve(EXAMPLES / "hostnames.yaml", "devcluster", ["profile.stage.env=true", *sets]))


def test_the_batch_script_stages_first_and_every_step_runs_the_staged_interpreter(tmp_path: Path) -> None:
    request = staged_request("resources.nodes=2")
    assert request.stage is not None and request.plan is not None
    script = tmp_path / "s.sh"
    script.write_text(request.script)
    subprocess.run(["bash", "-n", str(script)], check=True)
    subprocess.run([shutil.which("shellcheck") or "shellcheck", str(script)], check=True)
    lines = request.script.splitlines()
    staged = next(i for i, ln in enumerate(lines) if ln.startswith("export SLURMKIT_STAGED_PYTHON="))
    supervisor = next(i for i, ln in enumerate(lines) if "-m slurmkit.supervisor --run-dir" in ln and
                      "--stage-failed" not in ln)
    assert staged < supervisor and lines[supervisor].startswith('exec "$SLURMKIT_STAGED_PYTHON" -P')
    plan: Plan = request.plan
    os.environ[steps.STAGED_PYTHON_ENV] = "/local/env-x/bin/python"
    try:
        argv = steps.ranks(plan, steps.Container())
    finally:
        del os.environ[steps.STAGED_PYTHON_ENV]
    assert plan.staged_from is not None and plan.staged_from not in argv
    assert argv[argv.index("/local/env-x/bin/python") + 1:][:1] == ["-P"]


@pytest.mark.parametrize("sets", [["profile.executor=local"], ["launcher=torchrun"],
                                  ["profile.container.image=docker://x", "profile.container.runtime=pyxis"]])
def test_what_cannot_be_staged_yet_is_refused_in_one_line(sets: list[str]) -> None:
    with pytest.raises(StageError) as caught:
        staged_request(*sets)
    assert caught.value.where == "profile.stage"


def test_the_docs_profile_examples_validate(tmp_path: Path) -> None:
    from slurmkit.load.loader import load_profile

    blocks = [b.split("```", 1)[0] for b in (ROOT / "docs" / "staging.md").read_text().split("```yaml\n")[1:]]
    stages = []
    for i, block in enumerate(blocks):
        profile = tmp_path / f"staged{i}.yaml"
        profile.write_text("extends: cpu-partition\n" + block)
        stages.append(load_profile(str(profile)).stage)
    assert (stages[0].env, stages[0].local_root, stages[0].max_gb) == (True, "/local/slurmkit", 20)
    assert [d.to for d in stages[1].data] == ["tokens.bin", "val", "shards"]


def test_data_items_reach_the_nodes_folder_by_broadcast_copy_or_uri(tmp_path: Path) -> None:
    """One node's fetch (what the batch shell runs on each): a broadcast file moved into place, a
    folder copied, a URI fetched through fsspec; then nothing fetched twice; a source that is not
    there fails the node's health, no traceback."""
    from slurmkit.stage import fetch

    root, run_dir = tmp_path / "node" / "stage", tmp_path / "run"
    root.mkdir(parents=True, mode=0o700)
    run_dir.mkdir()
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "a.txt").write_text("a")
    (tmp_path / "tokens.bin").write_bytes(b"t" * 10)
    fetch.incoming(root, "7", "sent.bin").write_bytes(b"s" * 5)  # what sbcast left
    items = ["--item", str(tmp_path / "ds"), "ds", "--item", str(tmp_path / "tokens.bin"), "tokens.bin",
             "--item", "/nowhere/sent.bin", "sent.bin", "--item", f"file://{tmp_path / 'tokens.bin'}", "uri.bin"]
    assert fetch.main(["--root", str(root), "--job", "7", "--run-dir", str(run_dir), *items]) == 0
    folder = root / "data-7"
    assert (folder / "ds" / "a.txt").read_text() == "a" and (folder / "sent.bin").read_bytes() == b"s" * 5
    assert (folder / "tokens.bin").read_bytes() == (folder / "uri.bin").read_bytes() == b"t" * 10
    assert not fetch.incoming(root, "7", "sent.bin").exists()
    missing = ["--item", str(tmp_path / "gone"), "gone"]
    assert fetch.main(["--root", str(root), "--job", "8", "--run-dir", str(run_dir), *missing]) == 1
    (report,) = HealthReport.take_all(RunPaths(run_dir))
    assert report.problems[0].startswith("stage: data:") and not (root / "data-8" / "gone").exists()


def test_a_data_only_stage_renders_a_checked_script_that_fetches_on_every_node(tmp_path: Path) -> None:
    (tmp_path / "tokens.bin").write_bytes(b"t")
    profile = tmp_path / "p.yaml"
    profile.write_text(f"extends: devcluster\nstage:\n  data:\n    - {{from: {tmp_path / 'tokens.bin'}, "
                       "to: tokens.bin}\n    - {from: 's3://bucket/set', to: set}\n")
    request = jobs.dry_run(resolve(EXAMPLES / "hostnames.yaml", str(profile), []))
    assert request.stage is None and request.plan is not None and request.plan.staged_from is None
    script = tmp_path / "s.sh"
    script.write_text(request.script)
    subprocess.run([shutil.which("shellcheck") or "shellcheck", str(script)], check=True)
    sbcast = [ln for ln in request.script.splitlines() if "sbcast --jobid=\"$slurmkit_job\" --force -f" in ln]
    assert len(sbcast) == 1 and str(tmp_path / "tokens.bin") in sbcast[0]  # the file; the URI is fetched
    assert "-m slurmkit.stage.fetch" in request.script and "export SLURMKIT_STAGE=" in request.script


def test_staging_is_its_own_category_of_the_goodput_the_slowest_node_of_each_start(tmp_path: Path) -> None:
    """Two starts of job 7 (a requeue between them) on two nodes: the first node1's environment and
    data (3 + 1 s) against node2's 2 s, the second 0.5 s at most: 4.5 s of staging."""
    from slurmkit.insight import goodput
    from slurmkit.slurm.parse import Incarnation

    paths = RunPaths(tmp_path)
    lines = [("node1", "unpacked", 3.0, 0), ("node1", "data", 1.0, 0), ("node2", "unpacked", 2.0, 0),
             ("node1", "reused", 0.5, 1), ("node2", "reused", 0.2, 1)]
    paths.stage_log.write_text("".join(json.dumps({"node": n, "action": a, "seconds": s, "job": "7",
                                                   "restart_count": r}) + "\n" for n, a, s, r in lines))
    assert goodput.staging_seconds(paths) == 4.5
    records = [{"step": 10, "steps": 10, "step_s": 0.1, "step_s_sum": 1.0, "time": 1020.0}]
    inc = Incarnation("7", 990.0, 1000.0, 1030.0, "COMPLETED", "node[1-2]")
    plain = goodput.of_records(records, [inc]).result(now=1030.0)
    acc = goodput.Accountant([inc], goodput.staging_seconds(paths))
    for rec in reversed(records):
        acc.add(rec)
    staged = acc.result(now=1030.0)
    assert staged.staging_s == 4.5  # a first start's: out of its other time (a restart's: its overhead)
    assert staged.restart_overhead_s + staged.other_s == pytest.approx(plain.restart_overhead_s + plain.other_s - 4.5)
    assert plain.staging_s == 0.0 and staged.goodput == plain.goodput


def test_doctor_names_the_drift_between_this_hosts_packages_and_the_nodes() -> None:
    from slurmkit.insight import doctor

    here = {"torch": "2.13.0", "numpy": "2.1.0", "Typing_Extensions": "4.12"}
    there = {"torch": "2.12.0", "typing-extensions": "4.12", "scipy": "1.14"}
    assert doctor.drift(here, there) == [("numpy", "2.1.0", None), ("scipy", None, "1.14"),
                                         ("torch", "2.13.0", "2.12.0")]
    assert doctor.drift(here, dict(here)) == []


def test_a_node_that_could_not_stage_is_a_health_failure_decided_by_the_policy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch shell's `--stage-failed`: the nodes' health reports go to the restart policy as a
    failed health gate (cause node_failure, the nodes blamed and asked to be left out); with no
    Slurm to requeue here, the requeue it asks for fails and the job ends."""
    from slurmkit.common.record import RunFile, RunRecord
    from slurmkit.supervisor import main
    from tests.conftest import supervisor_events

    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm"))  # scontrol is not there: the requeue fails
    paths = RunPaths(tmp_path / "run")
    paths.job_folder.mkdir(parents=True)
    RunFile(paths).create(RunRecord(run_id="run", job_ids=["77"], num_tasks=2))
    HealthReport("node2", ["stage: the image's SHA-256 is not the packed one"], "stage", []).write(paths)
    assert main.main(["--run-dir", str(paths.run_dir), "--stage-failed"]) == 1
    (decision,) = supervisor_events(paths.run_dir, "decision")
    assert (decision["cause"], decision["exclude"]) == ("node_failure", ["node2"])
    assert [u.node for u in RunFile(paths).read().unhealthy] == ["node2"]


def test_a_folder_above_the_stage_another_user_could_swap_is_refused(tmp_path: Path) -> None:
    """The node's folder is ours, but the folder above it belongs to another user (who could rename
    ours away and put their own in its place): the node and the data fetch both refuse it."""
    from slurmkit.stage import fetch

    if os.geteuid() != 0:
        pytest.skip("NOT ROOT: cannot make a folder of another user's here")
    packed = _pack(tmp_path)
    run_dir, theirs = tmp_path / "run", tmp_path / "theirs"
    run_dir.mkdir()
    theirs.mkdir(mode=0o777)
    os.chown(theirs, 65534, 65534)  # nobody's
    root = theirs / "stage"
    root.mkdir(mode=0o700)
    assert _stage_node(root, packed, run_dir).returncode == 1
    assert fetch.main(["--root", str(root), "--job", "7", "--run-dir", str(run_dir)]) == 1
    assert len(HealthReport.take_all(RunPaths(run_dir))) == 1  # the node's one report, written twice
    assert list(root.iterdir()) == []
