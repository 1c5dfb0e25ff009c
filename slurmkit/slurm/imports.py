"""What the ranks' interpreter imports, asked on the login node before anything is queued: `ray` for
a `ray:` run, the top-level imports of a command's Python script (`command: python train.py`), the
packages of the trackers `tracking:` names, and for a `checkpoint_root` on an object store its
client package and the bucket, with the run's environment (credentials, endpoint).
A missing module then costs one line at submit, not a queue wait and a traceback on a compute node.

The interpreter is asked where the login node has it (the same path on a shared filesystem); one
that exists only on the compute nodes, or inside a container image, cannot be asked here and is not.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from slurmkit import __version__
from slurmkit.common.layout import OBJECT_STORES, expand_checkpoint_root
from slurmkit.config.resolved import Resolved
from slurmkit.errors import PreflightError

PYTHON_PROBE_TIMEOUT_S = 30
_STORE_PROBE = ("import sys\nfrom slurmkit.worker.checkpoint.store import CheckpointError, CheckpointStore\n"
                "try:\n    CheckpointStore(sys.argv[1])\nexcept CheckpointError as exc:\n    print(exc)\n"
                "    sys.exit(3)\n")
_MISSING_PROBE = ("import importlib.util, json, sys; "
                  "print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]))")


def _ranks_python(resolved: Resolved) -> str | None:
    """The ranks' interpreter, where it can be asked here: not in a container, executable on this host."""
    if resolved.profile.container is not None:
        return None
    python = os.path.expanduser(resolved.profile.python or sys.executable)
    return python if os.access(python, os.X_OK) else None


def missing(python: str, modules: list[str], path: list[str] | None = None) -> list[str] | None:
    """Those of `modules` that `python` cannot import (found on sys.path, nothing run); None where
    the interpreter could not be asked. `path` goes first on its sys.path, as a script's folder does.
    This very interpreter (the ranks' by default) is asked in this process: no second start."""
    if path is None and os.path.abspath(python) == os.path.abspath(sys.executable):
        return [m for m in modules if importlib.util.find_spec(m) is None]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)} if path else None
    try:
        proc = subprocess.run([python, "-P", "-c", _MISSING_PROBE, *modules], capture_output=True, text=True,
                              timeout=PYTHON_PROBE_TIMEOUT_S, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    found: list[str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return found


OLDEST_PYTHON = (3, 11)
"""python -P (no import from the working folder) came with 3.11: slurmkit's own interpreters use it."""


def check_python(python: str) -> None:
    """`python` is a Python slurmkit supports; an older one would fail on every rank (`Unknown option:
    -P`) after the queue wait. Asked isolated (-I), which every Python 3 takes."""
    try:
        proc = subprocess.run([python, "-I", "-c", "import sys; print(*sys.version_info[:3])"], capture_output=True,
                              text=True, timeout=PYTHON_PROBE_TIMEOUT_S)
        version = tuple(int(v) for v in proc.stdout.split())
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return  # not askable here: the ranks say so themselves
    if len(version) == 3 and version[:2] < OLDEST_PYTHON:
        raise PreflightError(f"the ranks' python {python} is Python {'.'.join(map(str, version))}; slurmkit needs "
                             f"{'.'.join(map(str, OLDEST_PYTHON))} or newer", where="profile:python",
                             valid="valid: an interpreter of Python 3.11 or newer with slurmkit (and torch to train)")


IMAGE_PROBE_TIMEOUT_S = 120
_VERSION_PROBE = ("import importlib.metadata as m\ntry:\n    print(m.version('slurmkit'))\n"
                  "except m.PackageNotFoundError:\n    print('none')\n")


def _image_argv(resolved: Resolved) -> list[str] | None:
    """How to run a command in the run's image here, where that costs no pull: an apptainer image
    file that is here, a docker image the local daemon has; None otherwise."""
    c = resolved.profile.container
    if c is None or c.runtime == "pyxis" or (binary := shutil.which(c.runtime)) is None:
        return None
    if c.runtime == "apptainer":
        return [binary, "exec", c.image] if Path(c.image).is_file() else None
    known = subprocess.run([binary, "image", "inspect", c.image], capture_output=True, timeout=PYTHON_PROBE_TIMEOUT_S)
    return [binary, "run", "--rm", c.image] if known.returncode == 0 else None


_DIST_INFO = re.compile(r"/(?:site|dist)-packages/slurmkit-([^/]+)\.dist-info$", re.MULTILINE)


def squashfs_slurmkit(image: str) -> str | None:
    """The slurmkit version installed in a squashfs image file (what `enroot import` writes and pyxis
    runs), read from its listing (`unsquashfs -l`: nothing in it runs): "none" where it has no
    slurmkit; None where it cannot be read here."""
    binary = shutil.which("unsquashfs")
    if binary is None:
        return None
    try:
        proc = subprocess.run([binary, "-l", image], capture_output=True, text=True, errors="replace",
                              timeout=IMAGE_PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    found = _DIST_INFO.findall(proc.stdout)
    return found[0] if found else "none"


def _image_slurmkit(resolved: Resolved) -> str | None:
    """The image's slurmkit version ("none": it has none), where the image can be asked here at no
    pull's cost; None otherwise. A pyxis image from a registry is pulled on the compute nodes only."""
    c = resolved.profile.container
    if c is None:
        return None
    if c.runtime == "pyxis":
        image = os.path.expanduser(c.image)
        return squashfs_slurmkit(image) if "#" not in image and Path(image).is_file() else None
    argv = _image_argv(resolved)
    if argv is None:
        return None
    python = c.python or resolved.profile.python or "python3"
    proc = subprocess.run([*argv, python, "-I", "-c", _VERSION_PROBE], capture_output=True, text=True,
                          timeout=IMAGE_PROBE_TIMEOUT_S)
    return proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout.strip() else None


def check_image(resolved: Resolved) -> None:
    """The container's Python has slurmkit at this client's version: every rank runs slurmkit's
    worker inside the image (an NGC image has none). Asked where that costs no pull: an apptainer
    image file or a docker image the daemon has is run here; a pyxis squashfs file is listed. A
    pyxis image from a registry is not asked (docs/containers.md). A runtime that does not answer
    is not waited for: the ranks say so themselves."""
    c = resolved.profile.container
    try:
        found = _image_slurmkit(resolved)
    except (OSError, subprocess.TimeoutExpired):
        return
    if c is None or found is None or found == __version__:
        return
    python = c.python or resolved.profile.python or "python3"
    what = "has no slurmkit" if found == "none" else f"has slurmkit {found}, and this client is {__version__}"
    raise PreflightError(f"{python} in image {c.image} {what}", where="profile:container.image",
                         valid=f"valid: an image whose {python} has slurmkit {__version__} "
                               f"(pip install 'slurmkit=={__version__}' in it; docs/containers.md)")


def check_ray_importable(resolved: Resolved) -> None:
    """A `ray:` run needs `ray` in the ranks' interpreter."""
    python = _ranks_python(resolved)
    if resolved.spec.ray is None or python is None:
        return
    if missing(python, ["ray"]):
        raise PreflightError(f"ray is not importable by the ranks' python {python}", where="profile:python",
                             valid=f"valid: an interpreter with Ray: {python} -m pip install 'ray[default]'")


def check_packages(resolved: Resolved) -> None:
    """One ask of the ranks' interpreter for the packages the run needs there: torch for a `task:`
    (slurmkit's client installs without it: slurmkit[train]), and the package of each tracker
    `tracking:` names (rank 0 would otherwise leave it out with one line, and the run go unrecorded).
    An interpreter that cannot be asked so is asked its version (check_python); a container's image
    which slurmkit it has (check_image)."""
    check_image(resolved)
    python = _ranks_python(resolved)
    if python is None:
        return
    t = resolved.tracking
    trackers = [] if t is None else [name for name, on in (("mlflow", t.mlflow), ("tensorboard", t.tensorboard),
                                                           ("wandb", t.wandb)) if on]
    gone = missing(python, (["torch"] if resolved.spec.task else []) + trackers)
    if gone is None:
        check_python(python)
    if not gone:
        return
    if "torch" in gone:
        raise PreflightError(f"task {resolved.spec.task} trains with torch, which the ranks' python {python} cannot "
                             "import", where=f"{resolved.spec_source}:task",
                             valid=f"valid: {python} -m pip install 'slurmkit[train]', or a profile python with torch")
    raise PreflightError(f"tracking names {', '.join(gone)}, which the ranks' python {python} cannot import",
                         where=f"{resolved.spec_source}:tracking",
                         valid=f"valid: {python} -m pip install 'slurmkit[tracking]' (or {' '.join(gone)})")


def command_python(command: str, ranks_python: str) -> tuple[str, list[str]] | None:
    """(the interpreter a command runs, its arguments) where the command starts with one (`python`,
    `python3.12`, a path to one); else None. A bare name is looked up as the rank does: in the ranks'
    interpreter's folder first (worker.command.own_python_first), then on PATH."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    while words and "=" in words[0] and not words[0].startswith("="):  # VAR=value python ...
        words = words[1:]
    if not words or not os.path.basename(words[0]).startswith("python"):
        return None
    name = words[0]
    if os.sep in name:
        return os.path.expanduser(name), words[1:]
    beside = Path(ranks_python).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    return (found, words[1:]) if found else None


def script_imports(script: Path) -> list[str]:
    """The top-level packages a script imports unconditionally (module-level statements; one inside
    `try:` or a function may be optional and is not counted), in order, each once."""
    tree = ast.parse(script.read_text(errors="replace"), filename=str(script))
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module.split(".")[0])
    return [n for n in dict.fromkeys(names) if n != "__future__"]


def _imports_asked(args: list[str]) -> tuple[list[str], list[str], str] | None:
    """(modules, sys.path head, what) for `python [-opts] script.py` or `python -m module`."""
    for i, arg in enumerate(args):
        if arg == "-m" and i + 1 < len(args):
            return [args[i + 1].split(".")[0]], [os.getcwd()], f"-m {args[i + 1]}"
        if arg == "-c":
            return None
        if not arg.startswith("-"):
            script = Path(arg)
            if script.suffix != ".py" or not script.is_file():
                return None
            try:
                return script_imports(script), [str(script.resolve().parent)], arg
            except (SyntaxError, ValueError, OSError):
                return None  # the rank's own Python will say what is wrong with it
    return None


def check_command_imports(resolved: Resolved, where: str) -> None:
    """A command run's Python script: every module it imports at its top level is importable by the
    interpreter the command names (its `python` is the ranks' own where that folder has one)."""
    ranks_python = _ranks_python(resolved)
    if resolved.spec.command is None or ranks_python is None:
        return
    found = command_python(resolved.spec.command, ranks_python)
    asked = _imports_asked(found[1]) if found else None
    if found is None or asked is None or not asked[0]:
        return
    modules, path, what = asked
    gone = missing(found[0], modules, [*path, *_run_pythonpath(resolved)])
    if gone:
        raise PreflightError(
            f"{what} imports {', '.join(gone)}, which the command's python {found[0]} cannot import",
            where=f"{where}:command",
            valid=f"valid: install it there ({found[0]} -m pip install ...), or name the interpreter that has it")


def _run_pythonpath(resolved: Resolved) -> list[str]:
    """The PYTHONPATH the ranks get: the spec's env, else the profile's setup env, else the one
    submit runs in (Slurm carries it), after the script's own folder, as Python orders them."""
    for env in (resolved.spec.env, resolved.profile.setup.env, os.environ):
        if "PYTHONPATH" in env:
            return [p for p in env["PYTHONPATH"].split(os.pathsep) if p]
    return []


def check_storage(resolved: Resolved) -> None:
    """A checkpoint_root on an object store: the ranks' interpreter has its client (s3fs for s3://)
    and, with the run's environment, reaches the bucket (one listing, as the ranks' first save would)."""
    root = resolved.profile.checkpoint_root
    python = _ranks_python(resolved)
    protocol = root.split("://", 1)[0] if root and "://" in root else ""
    if python is None or root is None or protocol not in OBJECT_STORES:
        return
    package = OBJECT_STORES[protocol]
    if missing(python, [package]):
        raise PreflightError(f"checkpoint_root {root} needs {package}, which the ranks' python {python} cannot "
                             "import", where="profile:checkpoint_root",
                             valid=f"valid: {python} -m pip install 'slurmkit[s3]' (or {package})")
    env = {**os.environ, **resolved.profile.setup.env, **resolved.spec.env}
    try:
        proc = subprocess.run([python, "-P", "-c", _STORE_PROBE, expand_checkpoint_root(root)], capture_output=True,
                              text=True, timeout=PYTHON_PROBE_TIMEOUT_S, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return
    if proc.returncode == 3:
        raise PreflightError(proc.stdout.strip().splitlines()[-1], where="profile:checkpoint_root",
                             valid="valid: a bucket the ranks can reach with the run's environment "
                                   "(`slurmkit doctor` asks from a compute node)")
