"""The login host's side of a forwarded command (its entry: `python -P -m slurmkit.cli.serve_command REQUEST`,
or slurmkit.api.serve_call for a Python API call): the stage the request's files go to, and `fetch`.

REQUEST (base64 JSON, slurmkit.remote.request) carries the command line, the profile's layers as
the laptop read them (without `login`) and, where files go with the command, says a tar stream
follows on stdin. This writes them into a private stage folder (~/.cache/slurmkit/remote/ID,
0700), runs the command there in this process, and removes the stage; a command's output files
(report -o) wait in the stage's out/ until the laptop fetches them (`fetch ID`, one tar stream).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml

from slurmkit import __version__
from slurmkit.common.atomic import atomic_write_text
from slurmkit.config.profile import ClusterProfile
from slurmkit.jsontypes import JsonObject
from slurmkit.remote import unpack
from slurmkit.remote.connection import private_cache
from slurmkit.remote.request import Request


def stage_root() -> Path:
    return private_cache("remote")


def hello() -> dict[str, str]:
    """What `connect` compares with the laptop's."""
    return {"slurmkit": __version__, "python": platform.python_version(), "executable": sys.executable}


PICKLE_SLACK = 1 << 30
"""What a request may carry beside its code: spec files and a pickled function (with its data)."""


def _limit(req: Request) -> int:
    """The most bytes a request's files may hold: the profile's snapshot_max_mb, and PICKLE_SLACK."""
    mb = next((d["snapshot_max_mb"] for _, d in reversed(req.profile) if isinstance(d.get("snapshot_max_mb"), int)),
              ClusterProfile.model_fields["snapshot_max_mb"].default)
    return int(mb) * (1 << 20) + PICKLE_SLACK


@contextlib.contextmanager
def staging(req: Request, keep_output: bool = False) -> Iterator[Path]:
    """A private stage folder with the request's files unpacked in it (slurmkit.remote.unpack),
    always removed after, unless `keep_output` and the command left an out/ for the laptop to fetch."""
    stage = stage_root() / req.stage_id
    stage.mkdir(mode=0o700)  # an existing one is not ours to reuse
    keep = False
    try:
        if req.files:
            unpack.extract(sys.stdin.buffer, stage, _limit(req))
        yield stage
        keep = keep_output and (stage / "out").is_dir()
    finally:
        os.chdir("/")
        if not keep:
            shutil.rmtree(stage, ignore_errors=True)


def profile_file(req: Request) -> Path:
    """The profile as the laptop read it, written where it stays (run.json and a sweep's manifest
    name it): ~/.cache/slurmkit/profiles/NAME-HASH/, one file a layer."""
    # Named by its content too: two laptops' profiles of one name never overwrite each other.
    digest = hashlib.sha256(json.dumps(req.profile, sort_keys=True).encode()).hexdigest()[:12]
    folder = private_cache("profiles") / f"{Path(req.profile[-1][0]).stem}-{digest}"
    folder.mkdir(mode=0o700, exist_ok=True)
    parent: str | None = None
    for i, (name, data) in enumerate(req.profile):
        target = folder / f"{i}-{name}"
        atomic_write_text(target, yaml.safe_dump({**data, **({"extends": parent} if parent else {})},
                                                 sort_keys=False))
        parent = target.name
    return folder / str(parent)


def api(req: Request, print_answer: Callable[[JsonObject, Path, str], int]) -> int:
    """A Python API method (slurmkit.api.serve_call's entry, which passes its `print_answer`);
    the stage holds the function sent along."""
    req.check_versions(hello())
    with staging(req) as stage:
        os.chdir(Path.home())
        assert req.api is not None
        return print_answer(req.api, stage, str(profile_file(req)))


def fetch(stage_id: str) -> int:
    """The stage's out/ as one tar stream on stdout, then the stage removed."""
    stage = stage_root() / Request.checked_stage_id(stage_id)
    try:
        with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as tar:
            if (stage / "out").is_dir():
                tar.add(stage / "out", arcname="out")
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    sys.stdout.flush()
    return 0
