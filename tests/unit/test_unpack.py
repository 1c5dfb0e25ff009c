"""The login host's unpacking of what a laptop sends (slurmkit.remote.unpack), on every interpreter a
login host runs: this one, and Debian 12's own python3 (3.11.2, whose tarfile has no `filter=`)."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from slurmkit.cli import serve_command
from slurmkit.remote import login_side
from slurmkit.remote.request import Request

ROOT = Path(__file__).resolve().parents[2]
DEBIAN_PYTHON = "/usr/bin/python3"
INTERPRETERS = [sys.executable] + ([DEBIAN_PYTHON] if Path(DEBIAN_PYTHON).exists() else [])
# Runs extract() in the given interpreter; prints what happened as JSON.
DRIVER = """
import json, sys
from pathlib import Path
from slurmkit.remote.unpack import UnpackError, extract
try:
    extract(sys.stdin.buffer, Path(sys.argv[1]), int(sys.argv[2]))
    print(json.dumps({"ok": True, "python": sys.version.split()[0]}))
except UnpackError as exc:
    print(json.dumps({"ok": False, "member": exc.member, "line": exc.one_line(), "python": sys.version.split()[0]}))
"""


def tar_of(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w|") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", link: str = "",
           mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, mode
    if kind == tarfile.REGTYPE:
        info.size = len(data)
        return info, data
    return info, None


def unpack(python: str, data: bytes, stage: Path, limit: int = 1 << 20) -> dict[str, object]:
    stage.mkdir(mode=0o700)
    done = subprocess.run([python, "-P", "-c", DRIVER, str(stage), str(limit)], input=data, capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd="/", timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr.decode(), done.stderr.decode()
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.fixture(params=INTERPRETERS, ids=lambda p: "debian-python3" if p == DEBIAN_PYTHON else "this-python")
def python(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_debian_python_is_the_one_without_tarfile_filters() -> None:
    if not Path(DEBIAN_PYTHON).exists():
        pytest.skip("no Debian python3 on this machine")
    version = subprocess.run([DEBIAN_PYTHON, "-c", "import sys, tarfile; print(sys.version_info[:3], "
                              "hasattr(tarfile, 'data_filter'))"], capture_output=True, text=True, check=True)
    assert version.stdout.split() == ["(3,", "11,", "2)", "False"]  # the interpreter the issue names


def test_code_with_folders_relative_links_and_hard_links_unpacks(python: str, tmp_path: Path) -> None:
    stage = tmp_path / "stage"
    result = unpack(python, tar_of(
        member("work/pkg", tarfile.DIRTYPE, mode=0o755), member("work/pkg/a.py", data=b"A = 1\n", mode=0o4755),
        member("work/run.sh", data=b"#!/bin/sh\n", mode=0o6775), member("work/latest", tarfile.SYMTYPE, link="pkg"),
        member("work/pkg/up", tarfile.SYMTYPE, link="../run.sh"),
        member("work/same.py", tarfile.LNKTYPE, link="work/pkg/a.py")), stage)
    assert result["ok"] is True
    assert (stage / "work/latest/a.py").read_bytes() == b"A = 1\n"
    assert (stage / "work/same.py").read_bytes() == b"A = 1\n"
    # No setuid, setgid or sticky bit, nothing for the group or others.
    assert stat.S_IMODE((stage / "work/pkg/a.py").stat().st_mode) == 0o700
    assert stat.S_IMODE((stage / "work/run.sh").stat().st_mode) == 0o700
    assert stat.S_IMODE((stage / "work/pkg").stat().st_mode) == 0o700


HOSTILE: dict[str, Callable[[], list[tuple[tarfile.TarInfo, bytes | None]]]] = {
    "absolute symlink": lambda: [member("work/data", tarfile.SYMTYPE, link="/scratch/ds")],
    "symlink out": lambda: [member("work/x", tarfile.SYMTYPE, link="../../etc")],
    "link through a link": lambda: [member("a", tarfile.SYMTYPE, link="."), member("b", tarfile.SYMTYPE, link="a/..")],
    "absolute name": lambda: [member("/tmp/planted", data=b"x")],
    "dotdot name": lambda: [member("work/../../planted", data=b"x")],
    "no name": lambda: [member(".", tarfile.DIRTYPE)],
    "file through a link": lambda: [member("d", tarfile.SYMTYPE, link="."), member("d/f", data=b"x")],
    "device": lambda: [member("work/null", tarfile.CHRTYPE)],
    "fifo": lambda: [member("work/pipe", tarfile.FIFOTYPE)],
    "hard link to nothing sent": lambda: [member("work/h", tarfile.LNKTYPE, link="/etc/passwd")],
    "over the size": lambda: [member("work/big.bin", data=b"x" * 4096)],
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_member_is_refused_in_one_line_naming_it(python: str, tmp_path: Path, case: str) -> None:
    members = HOSTILE[case]()
    result = unpack(python, tar_of(*members), tmp_path / "stage", limit=1024)
    assert result["ok"] is False
    assert result["member"] == members[-1][0].name
    assert "\n" not in str(result["line"])
    assert not (tmp_path / "planted").exists() and not Path("/tmp/planted").exists()


def test_a_refused_request_leaves_no_stage_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    profile = [("site.yaml", {"extends": "local"})]
    req = Request("run", argv=["render", "slurmkit-stage:files/0-spec.yaml"], profile=profile, files=True,
                  command="render", slurmkit=login_side.hello()["slurmkit"], python=login_side.hello()["python"])
    data = tar_of(member("files/0-spec.yaml", data=b"name: x\ncommand: echo\n"),
                  member("work/data", tarfile.SYMTYPE, link="/scratch/ds"))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert serve_command.main([req.encode()]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert list(login_side.stage_root().iterdir()) == []
