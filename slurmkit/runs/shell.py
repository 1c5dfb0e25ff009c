"""`slurmkit shell -p P`: an interactive allocation with a profile's resources, and a shell on its
first node with the profile's modules, venv, variables and setup commands, as a batch job of that
profile would see them (`salloc`, then `srun --pty bash --rcfile`), in the profile's container when it
has one (the ranks' image, mounts and variables). The rc file lives in a folder of the
caller's own under the profile's run_root (the compute node reads it) and is removed when the shell ends."""

from __future__ import annotations

import shutil
from pathlib import Path

from slurmkit.common.atomic import atomic_write_text
from slurmkit.errors import SlurmkitError
from slurmkit.load.loader import resolve
from slurmkit.render import render_interactive, render_shell_rc
from slurmkit.runs import registry
from slurmkit.slurm import interactive

SHELL_SPEC = {"name": "shell", "command": "bash"}
RC_FILE = "shell_rc.sh"
LAUNCHER = "interactive.sh"


def prepare(profile: str | None, sets: list[str]) -> tuple[list[str], Path]:
    """The salloc argv and the folder holding its rc file; a profile it cannot serve is one line."""
    resolved = resolve(SHELL_SPEC, profile, sets)
    p = resolved.profile
    if p.executor != "slurm":
        raise SlurmkitError("a shell needs a Slurm cluster", where="profile:executor",
                            valid="valid: a profile with executor: slurm (the local one runs no allocation)")
    folder = registry.create(p.run_root, "shell", p.run_mode).run_dir
    rc = folder / RC_FILE
    atomic_write_text(rc, render_shell_rc(resolved))
    launcher = None
    if p.container is not None:  # the shell runs in the ranks' container; the folder is mounted in it
        launcher = str(folder / LAUNCHER)
        atomic_write_text(launcher, render_interactive(resolved, str(folder)))
    return interactive.salloc_argv(resolved, str(rc), launcher), folder


def open_shell(profile: str | None, sets: list[str]) -> int:
    """Wait for the allocation, run the shell in it until the user leaves; its exit status."""
    argv, folder = prepare(profile, sets)
    try:
        return interactive.run_interactive(argv)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
