"""A property of every command that takes a run or sweep: whatever id, prefix or path is typed (with
`/`, `..`, symlinks, other users' folders, planted folders in the working folder), the command
either acts on one of the caller's own runs or prints one line and exits 2.

Other users' folders are made by chown, so this needs root (CI runs as root)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from slurmkit.cli.app import app
from slurmkit.runs import folders, lookup

OTHER_UID = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="other users' folders are made by chown (root)")
runner = CliRunner()
COMMANDS = [["status"], ["logs"], ["cancel"], ["result"], ["resubmit"], ["report"],
            ["sweep", "status"], ["sweep", "results"], ["sweep", "resubmit"], ["sweep", "cancel"]]


def _folder(path: Path, marker: str, record: dict[str, Any], owner: int | None = None) -> Path:
    (path / "submitit").mkdir(parents=True)
    (path / marker).write_text(json.dumps(record))
    if owner is not None:
        for p in (path, path / "submitit", path / marker):
            os.chown(p, owner, owner)
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    top = tmp_path_factory.mktemp("world")
    root, scratch = top / "runs", top / "scratch"
    scratch.mkdir()
    os.chmod(scratch, 0o1777)  # a shared scratch folder, as /tmp
    record = {"executor": "local", "num_tasks": 1, "job_ids": []}
    own = [_folder(root / f"mine-2026120{i}-000000-abc{i}", "run.json", {"run_id": f"mine{i}", **record})
           for i in (1, 2)]
    foreign = _folder(root / "theirs-20261201-000000-dead", "run.json", record, OTHER_UID)
    _folder(root / "sweep-20261201-000000-beef", "sweep.json", {"arrays": []}, OTHER_UID)
    _folder(scratch / "evil", "run.json", {**record, "executor": "slurm", "job_ids": ["--user=alice"]}, OTHER_UID)
    _folder(scratch / "evil-sweep", "sweep.json", {"profile": {"setup": {"commands": ["touch PWNED"]}}}, OTHER_UID)
    (scratch / "link-mine").symlink_to(own[0])
    (scratch / "link-theirs").symlink_to(foreign)
    profile = top / "p.yaml"
    profile.write_text(f"extends: local\nrun_root: {root}\n")
    parts = ["mine", "mine1", "mine-2026120", "theirs", "evil", "evil-sweep", "sweep", "link-mine", "link-theirs",
             "..", ".", "runs", "scratch", own[0].name, foreign.name, "123", "123_4", "--user=x", "~", "*"]
    yield {"root": root, "scratch": scratch, "profile": profile, "own": {p.resolve() for p in own},
           "parts": parts, "top": top}


@pytest.fixture
def found(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every folder a lookup hands to a command."""
    seen: list[Path] = []
    real = lookup.find_folder

    def spy(*args: Any) -> Path:
        folder = real(*args)
        seen.append(folder)
        return folder

    monkeypatch.setattr(lookup, "find_folder", spy)
    monkeypatch.setattr(folders, "find_folder", spy)  # find_sweep
    return seen


def idents(parts: list[str], top: Path) -> st.SearchStrategy[str]:
    joined = st.lists(st.sampled_from(parts), min_size=1, max_size=4).map("/".join)
    return st.one_of(st.sampled_from(parts), joined, joined.map(lambda p: f"{top}/{p}"),
                     st.text(alphabet="ab-_./~$12*", min_size=1, max_size=12))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_run_command_acts_on_the_callers_own_run_or_says_one_line(
        world: dict[str, Any], found: list[Path], monkeypatch: pytest.MonkeyPatch, data: st.DataObject) -> None:
    monkeypatch.chdir(world["scratch"])
    command = data.draw(st.sampled_from(COMMANDS))
    ident = data.draw(idents(world["parts"], world["top"]))
    found.clear()
    result = runner.invoke(app, [*command, "-p", str(world["profile"]), "--", ident])  # -- : an id, not an option
    assert result.exception is None or isinstance(result.exception, SystemExit), (command, ident, result.exception)
    assert all(f.resolve() in world["own"] for f in found), (command, ident, found)
    if not found:  # nothing of the caller's was named: one line, exit 2
        assert result.exit_code == 2, (command, ident, result.output)
        lines = [ln for ln in result.stderr.strip().splitlines() if not ln.startswith("warning: skipped")]
        assert len(lines) == 1 and lines[0].startswith("error: "), (command, ident, result.stderr)
    assert not (world["scratch"] / "PWNED").exists()


@pytest.mark.parametrize(("ident", "acts"), [
    ("mine-20261201", True), ("../runs/mine-20261202-000000-abc2", True),  # a prefix, a path: the caller's own
    ("evil", False), ("./evil", False), ("theirs", False), ("../runs/theirs-20261201-000000-dead", False),
    ("./link-mine", False), ("./link-theirs", False), ("123", False), ("--user=x", False)])
def test_the_property_sees_both_outcomes(world: dict[str, Any], found: list[Path], monkeypatch: pytest.MonkeyPatch,
                                         ident: str, acts: bool) -> None:
    monkeypatch.chdir(world["scratch"])
    result = runner.invoke(app, ["status", "-p", str(world["profile"]), "--", ident])
    assert result.exit_code == (0 if acts else 2), result.output
    assert [f.resolve() in world["own"] for f in found] == ([True] if acts else [])
