"""Rendering the sbatch script from Jinja templates.

Every `{{ value }}` is shell-quoted by the environment's finalize hook unless the template marks
it `| raw`; that inversion makes forgetting to quote impossible, rather than a review item.
"""

from __future__ import annotations

import functools
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from slurmkit import trust
from slurmkit.common import ports
from slurmkit.common.layout import expand_root
from slurmkit.common.slurm_env import STAGED_PYTHON_ENV, rank_env
from slurmkit.common.supervisor_plan import Plan
from slurmkit.config.fields import has_control, sbatch_safe
from slurmkit.config.profile import ClusterProfile
from slurmkit.config.resolved import Resolved
from slurmkit.config.slurm_args import sbatch_lines
from slurmkit.errors import RenderError, clip
from slurmkit.jsontypes import JsonObject
from slurmkit.resources import shipped_dir
from slurmkit.stage.envpack import EnvImage

ENTRY_TEMPLATE = "sbatch.sh.j2"
DEFAULT_STAGE_ROOT = '"${SLURM_TMPDIR:-/tmp/slurmkit-$(id -u)}/stage"'
"""Where stage.env unpacks on each node unless the profile names stage.local_root (shell, not user input)."""


class Shell(str):
    """Text that is already valid shell: quoted by `q`, or trusted by `raw`."""


RESERVED_WORDS = frozenset({"if", "then", "else", "elif", "fi", "case", "esac", "for", "select", "while", "until",
                            "do", "done", "in", "function", "time", "coproc", "{", "}", "!", "[[", "]]"})
"""bash's reserved words: safe as arguments, but shellcheck reads some of them as syntax."""


def shell_quote(value: object) -> Shell:
    if isinstance(value, Shell):
        return value
    if isinstance(value, bool):
        value = "1" if value else "0"
    text = str(value)
    if "\\" in text:
        # '\' is correct bash, but shellcheck flags it (SC1003); $'...' says the same unambiguously.
        return Shell("$'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'")
    if text in RESERVED_WORDS:
        # `module load then` is correct bash, but shellcheck reads the keyword (SC1010): quoted, it is a word.
        return Shell(f"'{text}'")
    return Shell(shlex.quote(text))


def _raw(value: object) -> Shell:
    return Shell(str(value))


def sbatch_value(value: object, option: str, pattern: bool = False) -> Shell:
    """A value for an #SBATCH line, which sbatch's own parser reads (not bash): refuse what it
    reads specially, then quote. pattern: a log path whose file name holds our own %j/%t patterns."""
    text = str(value)
    checked = text.rsplit("/", 1)[0] if pattern else text
    try:
        sbatch_safe(checked)
        if has_control(text):
            raise ValueError(f"{clip(text)} holds control characters; valid: one line of text")
    except ValueError as exc:
        raise RenderError(f"#SBATCH --{option}: {exc}") from None
    return shell_quote(text)


def _finalize(value: object) -> Any:
    return shell_quote(value)


class OwnTemplates(jinja2.BaseLoader):
    """A profile's template_dir: each template is read from a file opened once and checked open
    (trust.open_config): the caller's or root's, writable by no one else, no symlink at its name. A
    template planted by another user renders nothing: it is one line naming it and its owner."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def get_source(self, environment: jinja2.Environment, template: str) -> tuple[str, str, Any]:
        path = os.path.join(self.folder, *jinja2.loaders.split_template_path(template))
        try:
            fd = trust.open_config(path)
        except (FileNotFoundError, NotADirectoryError):
            raise jinja2.TemplateNotFound(template) from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            source = f.read().decode("utf-8")

        def uptodate() -> bool:
            # ctime moves with a write, a chown and a chmod: a file changed in any way is read and checked again.
            try:
                now = os.lstat(path)
            except OSError:
                return False
            return (now.st_ino, now.st_ctime_ns) == (st.st_ino, st.st_ctime_ns)

        return source, path, uptodate


def make_environment(profile: ClusterProfile) -> jinja2.Environment:
    """User templates first, then the shipped ones; `slurmkit/NAME` always reaches the shipped NAME.
    The user's folder must be theirs (or root's) and writable by no one else, as each file in it, and
    so must the setup.venv activate script the batch shell sources (where it is on this host)."""
    if profile.setup.venv:
        activate = Path(profile.setup.venv).expanduser() / "bin" / "activate"
        if activate.exists():
            os.close(trust.open_config(os.path.realpath(activate)))
    folder, template_dir = None, profile.template_dir
    if template_dir:
        where = f"profile:template_dir={template_dir}"
        folder = Path(template_dir).expanduser()
        if not folder.is_dir():
            raise RenderError("template folder not found", where=where)
        trust.check(trust.reason(folder, follow=True), where, trust.CONFIG_VALID)
    return _environment(str(folder) if folder else None)


@functools.lru_cache(maxsize=8)
def _environment(folder: str | None) -> jinja2.Environment:
    """One environment per template folder, so each template compiles once per process (a
    100,000-task sweep renders ten arrays; compiling its eight templates is 0.1 s a render).
    Jinja still reloads a template whose file changed."""
    shipped = jinja2.FileSystemLoader(str(shipped_dir("templates")))
    loaders: list[jinja2.BaseLoader] = [OwnTemplates(folder)] if folder else []
    loaders += [jinja2.PrefixLoader({"slurmkit": shipped}), shipped]
    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader(loaders),
        undefined=jinja2.StrictUndefined,
        finalize=_finalize,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["q"] = shell_quote
    env.filters["raw"] = _raw
    env.filters["sbatch"] = sbatch_value
    return env


@dataclass(frozen=True)
class JobFiles:
    """Log paths as Slurm patterns (%j, %A_%a, %t) for the batch script and for each rank."""

    batch_stdout: str
    batch_stderr: str
    rank_stdout: str
    rank_stderr: str


@dataclass(frozen=True)
class RenderInput:
    resolved: Resolved
    command: str
    files: JobFiles
    python: str
    run_dir: str
    plan: Plan | None = None
    """The job's supervisor's plan (build.supervisor_plan), rendered as JSON into its last line."""
    array: str | None = None
    dependency: str | None = None
    sweep: JsonObject | None = None
    """For a sweep's job array: {"dir": sweep folder, "base": sweep index of array task 0}."""
    code_dir: str | None = None
    """The code snapshot the ranks run from (working directory and PYTHONPATH); None runs from the submit folder."""
    rank_python: str | None = None
    """The ranks' interpreter (the container's, if it names one); None: `python`, the host's."""
    stage: EnvImage | None = None
    """The environment the batch shell stages to every node first (profile stage.env)."""


def container_context(resolved: Resolved, run_dir: str) -> JsonObject:
    """Mounts (the user's, then the run folder, run_root and a local checkpoint root), env names, GPU flag."""
    c = resolved.profile.container
    if c is None:
        return {"srun": False, "prefix": False, "interactive": False}

    root = str(expand_root(resolved.profile.run_root))
    paths = [root] if run_dir.startswith(root.rstrip("/") + "/") else [root, run_dir]
    ckpt = resolved.profile.checkpoint_root
    if ckpt and ("://" not in ckpt or ckpt.startswith("file://")):
        paths.append(str(expand_root(ckpt.removeprefix("file://"))))
    taken = {m.split(":")[1] for m in c.mounts}
    mounts = [*c.mounts, *(f"{p}:{p}" for p in dict.fromkeys(paths) if p not in taken)]
    prof = resolved.profile
    spec = resolved.spec
    env_names = list(dict.fromkeys([*c.env, *prof.setup.env, *spec.env, *spec.secret_env, *prof.nccl_env]))
    gpus = c.gpus if c.gpus is not None else bool(resolved.node_gpus)
    return {"srun": c.runtime == "pyxis", "prefix": c.runtime != "pyxis", "mounts": mounts,
            "env_names": env_names, "gpus": gpus, "interactive": False}


def stage_context(resolved: Resolved, env: EnvImage | None, python: str) -> JsonObject | None:
    """What the batch shell's staging block needs (templates/partials/stage.sh.j2): the environment's
    image where stage.env packs one, the data items (a file among them goes by sbcast)."""
    stage = resolved.profile.stage
    if env is None and not stage.data:
        return None
    return {"root": Shell(shell_quote(stage.local_root) if stage.local_root else DEFAULT_STAGE_ROOT),
            "env": {"image": str(env.image), "digest": env.digest, "python": env.python} if env else None,
            "max_mb": stage.max_gb * 1024,
            "python": Shell(f'"${STAGED_PYTHON_ENV}" -P') if env else Shell(python),
            "data": [{"source": d.source, "to": d.to, "file": Path(d.source).is_file()} for d in stage.data]}


def render(inp: RenderInput) -> str:
    resolved = inp.resolved
    env = make_environment(resolved.profile)
    container = container_context(resolved, inp.run_dir)
    plan = inp.plan
    context = {
        "name": resolved.spec.name,
        "spec": resolved.spec,
        "sbatch_args": sbatch_lines(resolved.sbatch_args),
        "profile": resolved.profile,
        "r": resolved.resources,
        "alloc_nodes": resolved.shape.alloc_nodes,
        "shrinks": resolved.shape.shrinks,
        "node_gpus": resolved.node_gpus,
        "files": inp.files,
        "array": inp.array,
        "dependency": inp.dependency,
        "command": Shell(inp.command),
        "python": Shell(inp.python),
        "rank_python": Shell(inp.rank_python or inp.python),
        "run_dir": inp.run_dir,
        "sweep": inp.sweep,
        "code_dir": inp.code_dir,
        "container": container,
        "plan_json": plan.model_dump_json(exclude_defaults=True) if plan else None,
        "plan_lines": plan.describe() if plan else [],
        "env": resolved.spec.env,
        "slurm": resolved.profile.executor == "slurm",
        "ray_port": ports.ray_port_shell(),
        "rank_env": rank_env(resolved.profile.startup_timeout_s, resolved.profile.straggler_score),
        "stage": stage_context(resolved, inp.stage, inp.python),
        "supervisor_python": Shell(f'"${STAGED_PYTHON_ENV}" -P') if inp.stage else Shell(inp.python),
        "het": [{"r": p.resolved.resources, "alloc_nodes": p.resolved.shape.alloc_nodes} for p in resolved.parts],
        # Each part's own container (its own, or the profile's), its arrays named for its het group.
        "het_containers": [{"group": p.group, "name": p.name, "c": p.resolved.profile.container,
                            "ctx": container_context(p.resolved, inp.run_dir)}
                           for p in resolved.parts if p.resolved.profile.container is not None],
    }
    try:
        return env.get_template(ENTRY_TEMPLATE).render(context)
    except jinja2.TemplateError as exc:
        where = getattr(exc, "filename", None) or getattr(exc, "name", None) or ENTRY_TEMPLATE
        lineno = getattr(exc, "lineno", None)
        raise RenderError(f"template error: {exc.message}", where=f"{where}:{lineno}" if lineno else where) from exc


SHELL_RC_TEMPLATE = "shell_rc.sh.j2"
INTERACTIVE_TEMPLATE = "interactive.sh.j2"


def render_interactive(resolved: Resolved, run_dir: str) -> str:
    """`slurmkit shell`/`attach`'s launcher into the profile's container (profile.container set):
    `bash FILE SRUN_OPTION... -- COMMAND...`. The container is the ranks' own: image, mounts (the run
    folder and run_root among them), variables, GPU flags; docker's gets a terminal (-it)."""
    env = make_environment(resolved.profile)
    context = {"profile": resolved.profile, "container": {**container_context(resolved, run_dir), "interactive": True},
               "het": []}  # a shell is one allocation: the profile's container (partials/container.sh.j2)
    try:
        return env.get_template(INTERACTIVE_TEMPLATE).render(context)
    except jinja2.TemplateError as exc:
        raise RenderError(f"template error: {exc.message}", where=INTERACTIVE_TEMPLATE) from exc


def render_shell_rc(resolved: Resolved) -> str:
    """`slurmkit shell`'s rc file: the profile's setup (modules, venv, variables, commands)."""
    env = make_environment(resolved.profile)
    try:
        return env.get_template(SHELL_RC_TEMPLATE).render({"profile": resolved.profile, "env": resolved.spec.env})
    except jinja2.TemplateError as exc:
        raise RenderError(f"template error: {exc.message}", where=SHELL_RC_TEMPLATE) from exc
