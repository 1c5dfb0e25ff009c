"""Code snapshots on a real git repository: what is copied, what is recorded, the size bound."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from slurmkit.errors import ConfigError
from slurmkit.runs import snapshot


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    (r / "pkg").mkdir(parents=True)
    (r / "pkg" / "model.py").write_text("VERSION = 1\n")
    (r / "train.py").write_text("print('hi')\n")
    (r / ".gitignore").write_text("data/\n*.log\n")
    (r / "gone.py").write_text("x = 1\n")
    git(r, "init", "-q")
    git(r, "add", ".")
    git(r, "commit", "-qm", "init")
    (r / "pkg" / "model.py").write_text("VERSION = 2\n")  # uncommitted change
    (r / "new_helper.py").write_text("y = 2\n")  # untracked, not ignored
    (r / "data").mkdir()
    (r / "data" / "big.bin").write_bytes(b"\0" * 4096)  # ignored
    (r / "run.log").write_text("ignored\n")
    (r / "gone.py").unlink()  # tracked, deleted on disk
    os.symlink("/nonexistent/dataset", r / "dataset")  # untracked link: copied as a link
    return r


def test_snapshot_copies_tracked_changed_and_untracked_not_ignored(repo: Path, tmp_path: Path) -> None:
    dest = tmp_path / "code"
    snap = snapshot.take(dest, repo, max_mb=10)
    files = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file() or p.is_symlink())
    assert files == [".gitignore", "dataset", "new_helper.py", "pkg/model.py", "train.py"]
    assert (dest / "pkg" / "model.py").read_text() == "VERSION = 2\n"  # the disk, not HEAD
    assert os.readlink(dest / "dataset") == "/nonexistent/dataset"
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert snap.git_commit == head.strip() and snap.dirty is True and snap.files == 5
    assert snap.bytes == sum((dest / f).stat().st_size for f in files if f != "dataset")


def test_snapshot_over_the_bound_is_refused_naming_the_largest(repo: Path, tmp_path: Path) -> None:
    (repo / "weights.pt").write_bytes(b"\1" * (2 << 20))
    dest = tmp_path / "code"
    with pytest.raises(ConfigError) as err:
        snapshot.take(dest, repo, max_mb=1)
    line = str(err.value)
    assert "over snapshot_max_mb=1" in line and "weights.pt (2 MB)" in line and "valid:" in line
    assert not dest.exists()  # checked before a byte is copied


def test_outside_git_the_module_folder_is_copied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "plain"
    (folder / "__pycache__").mkdir(parents=True)
    (folder / "mod.py").write_text("z = 3\n")
    (folder / "__pycache__" / "mod.cpython.pyc").write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    assert snapshot.source_of(str(folder / "mod.py")) == folder
    snap = snapshot.take(tmp_path / "code", folder, max_mb=1)
    assert snap.git_commit is None and snap.files == 1 and (tmp_path / "code" / "mod.py").exists()


def test_submit_records_the_snapshot_and_renders_the_cd(repo: Path, dev_profile: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmkit.load.loader import resolve
    from slurmkit.runs import jobs

    monkeypatch.chdir(repo)
    resolved = resolve({"name": "snap", "command": "true", "snapshot": True}, str(dev_profile))
    request = jobs.dry_run(resolved)  # the very run folder a submit would create
    assert f"cd {request.run_paths.code_dir} || exit 1" in request.script and 'PYTHONPATH=' in request.script
    plain = resolve({"name": "snap", "command": "true"}, str(dev_profile))
    assert "/code || exit 1" not in jobs.dry_run(plain).script
    with pytest.raises(ConfigError, match="snapshot_max_mb"):
        (repo / "weights.pt").write_bytes(b"\1" * (2 << 20))
        jobs.take_snapshot(resolve({"name": "s", "command": "true", "snapshot": True}, str(dev_profile),
                                   ["profile.snapshot_max_mb=1"]), repo.parent / "run", None)
