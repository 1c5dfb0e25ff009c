"""sbatch's own parser (not bash) reads #SBATCH lines: on the real dev cluster, hostile values that
slurmkit accepts reach Slurm exactly as written, and the rendered scripts pass `sbatch --test-only`.
Jobs run private: the job's umask keeps logs, outcomes and checkpoints from other users."""

from __future__ import annotations

import re
import stat
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmkit.common.layout import RunPaths
from slurmkit.config.slurm_args import OWN_NAMES_BELOW_OWNED, SLURMKIT_OWNS, SRUN_OWNS, owner_of
from slurmkit.errors import ConfigError
from slurmkit.load.loader import resolve
from slurmkit.runs import jobs
from tests.conftest import steady, write_spec
from tests.unit.test_quoting import PRINTABLE, SHELL_HOSTILE

pytestmark = pytest.mark.cluster

# What slurmkit lets through to an #SBATCH line: no space inside one sbatch_extra option.
word = st.text(PRINTABLE.filter(lambda c: c != " "), min_size=1, max_size=20)
path_part = st.text(PRINTABLE.filter(lambda c: c != "/"), min_size=1, max_size=20).filter(lambda s: s.strip("."))


def _show_job(job_id: str) -> dict[str, str]:
    """scontrol show job, one field per line where Slurm prints it so (Comment, StdOut, ...)."""
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, check=True,
                         timeout=30).stdout
    fields: dict[str, str] = {}
    for line in out.split("\n"):
        key, sep, value = line.strip().partition("=")
        if sep:
            fields[key] = value
    return fields


def test_accepted_hostile_values_reach_slurm_exactly(cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    seen: list[str] = []

    @settings(max_examples=8, deadline=None)
    @given(comment=st.one_of(st.sampled_from([v for v in SHELL_HOSTILE if " " not in v]), word), folder=path_part)
    def check(comment: str, folder: str) -> None:
        prof = tmp_path / f"p{len(seen)}.yaml"
        prof.write_text(yaml.safe_dump({"extends": str(dev_profile), "run_root": str(tmp_path / "runs" / folder),
                                        "sbatch_extra": ["--hold", f"--comment={comment}"]}))
        spec = write_spec(tmp_path, name="parsed", command="true")
        try:
            resolved = resolve(spec, str(prof))
        except ConfigError:  # refused with one line (tests/unit/test_hostile_fields.py): nothing reaches sbatch
            return
        sub = jobs.submit(resolved)
        assert sub.job_id is not None
        try:
            fields = _show_job(sub.job_id)
            assert fields["Comment"].rstrip(" ") == comment
            assert fields["StdOut"] == f"{sub.run_dir}/submitit/{sub.job_id}_0_log.out"
            assert fields["JobId"] == f"{sub.job_id} JobName=parsed"
        finally:
            subprocess.run(["scancel", sub.job_id], check=True, timeout=30)
        seen.append(comment)

    check()
    assert seen, "no accepted value was submitted"


@pytest.mark.parametrize("value", SHELL_HOSTILE)
def test_rendered_scripts_pass_sbatch_test_only(cluster: None, tmp_path: Path, dev_profile: Path, value: str) -> None:
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump({"extends": str(dev_profile), "run_root": str(tmp_path / "runs" / value),
                                    "setup": {"env": {"HOSTILE": value}, "venv": f"/opt/{value}"}}))
    spec = write_spec(tmp_path, name="testonly", command="true", env={"SPEC": value})
    script = tmp_path / "sbatch.sh"
    script.write_text(jobs.dry_run(resolve(spec, str(prof))).script)
    proc = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "to start at" in proc.stderr, proc.stderr


def test_a_job_writes_private_files(cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    spec = write_spec(tmp_path, name="private", callable="tests.helpers_fns:add", kwargs={"a": 1, "b": 2},
                      env={"SECRET_TOKEN": "hunter2"})
    sub = jobs.submit(resolve(spec, str(dev_profile)))
    paths = RunPaths(Path(sub.run_dir))
    assert jobs.wait(paths, poller=steady(0.5)).state == "COMPLETED"
    assert jobs.result(paths)["sum"] == 3
    written = [p for p in paths.run_dir.rglob("*") if not p.is_symlink()]
    names = {p.name.split("_")[-1] for p in written}
    assert {"sbatch.sh", "run.json", "submitted.pkl", "result.pkl", "log.out", "0.json", "outcomes"} <= names, names
    assert stat.S_IMODE(paths.run_dir.stat().st_mode) == 0o700
    for path in written:  # made by this process, by sbatch's job (its umask) and by the ranks
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, f"{path} is {oct(mode)}"


def _long_options(command: str) -> set[str]:
    """The long options the real command's --help lists."""
    out = subprocess.run([command, "--help"], capture_output=True, text=True, timeout=30, check=True).stdout
    return set(re.findall(r"--([a-z][a-z0-9-]+)", out))


def test_abbreviations_of_owned_options_are_refused_as_the_real_sbatch_and_srun_read_them(
        cluster: None, tmp_path: Path) -> None:
    # The premise: Slurm's own parsers (getopt_long) take a unique prefix for the whole option.
    held = subprocess.run(["sbatch", "--parsable", "--hold", f"--ou={tmp_path}/abbreviated.out", "--wrap=true"],
                          capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    try:
        assert _show_job(held)["StdOut"] == f"{tmp_path}/abbreviated.out"
    finally:
        subprocess.run(["scancel", held], timeout=30, check=True)
    step_out = tmp_path / "step.out"
    subprocess.run(["srun", "-N1", "-n1", f"--outp={step_out}", "echo", "abbreviated"], timeout=120, check=True)
    assert step_out.read_text().strip() == "abbreviated"
    # Every option of the real commands that is a prefix of an owned one is an option of its own name
    # (getopt_long takes an exact name as itself): slurmkit's exceptions list holds them all.
    for command, owns in (("sbatch", SLURMKIT_OWNS), ("srun", SRUN_OWNS)):
        real = _long_options(command)
        assert {"output", "signal", "export"} <= real, f"{command} --help was read"
        assert {o for o in real if o not in owns and any(k.startswith(o) for k in owns)} <= OWN_NAMES_BELOW_OWNED
        for owned in owns.keys() & real:
            for n in range(2, len(owned)):
                reached = [o for o in real if o.startswith(owned[:n])]
                if owned[:n] not in real and reached == [owned]:  # the real parser reads it as `owned`
                    assert owner_of(owned[:n], owns) == owned, (command, owned[:n])
