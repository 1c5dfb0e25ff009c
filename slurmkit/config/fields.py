"""Validators shared by the profile and run-spec models."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationInfo, field_validator

from slurmkit.config.text import clip

_TIME_RE = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^\d+-\d+$")
_MEM_RE = re.compile(r"^(\d+)([KMGT]?)B?$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SBATCH_OPT_RE = re.compile(r"^--[a-z][a-z0-9-]*(=.+)?$", re.DOTALL)


class Strict(BaseModel):
    """Every model refuses unknown keys, so a typo is an error rather than a silent default."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)
    multiline_fields: ClassVar[frozenset[str]] = frozenset()
    """Fields never rendered into the script, where newlines are legitimate."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: object, info: ValidationInfo) -> Any:
        # pydantic's lax mode reads true as 1: `nodes: true` would silently become one node.
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and not _admits_bool(field.annotation):
            raise ValueError(f"got the boolean {str(value).lower()}; valid: a number or text, not true/false "
                             "(YAML reads unquoted yes/no/on/off as booleans: quote them)")
        return value

    @field_validator("*", mode="after")
    @classmethod
    def _one_line_values(cls, value: object, info: ValidationInfo) -> Any:
        # A newline inside an #SBATCH value would start a new shell line; refuse it at the source.
        if info.field_name not in cls.multiline_fields and has_control(value):
            raise ValueError("control characters (newline, tab, NUL, ...) are not allowed; valid: one line of text")
        # Nothing carries a NUL: not argv, not the environment, not a file name (`embedded null byte`).
        if has_nul(value):
            raise ValueError("a NUL character is not allowed; valid: text without \\0")
        return value


def _admits_bool(annotation: object) -> bool:
    if annotation is bool or annotation is Any:
        return True
    return any(_admits_bool(a) for a in getattr(annotation, "__args__", ()) if a is not type(None))


def _control(c: str) -> bool:
    # C0, DEL, C1 and the Unicode line separators: each ends a line for some reader.
    return ord(c) < 32 or 127 <= ord(c) < 160 or c in "\u2028\u2029"


def _holds(value: object, bad: Callable[[str], bool]) -> bool:
    """Whether a string in `value` (keys of mappings and items of lists too) holds a character `bad` picks."""
    if isinstance(value, str):
        return any(bad(c) for c in value)
    if isinstance(value, dict):
        return any(_holds(k, bad) or _holds(v, bad) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_holds(v, bad) for v in value)
    return False


def has_control(value: object) -> bool:
    return _holds(value, _control)


def has_nul(value: object) -> bool:
    return _holds(value, "\x00".__eq__)


NO_LIMIT = "UNLIMITED"
_NO_LIMIT_WORDS = ("UNLIMITED", "INFINITE")
SLURM_INT_MAX = 2**31 - 1
"""The largest count sbatch parses (a C int); Slurm's job fields are narrower still (SLURM_U16_MAX)."""
SLURM_U16_MAX = 65533
"""Per-node and per-task counts are 16-bit in Slurm's job record, whose top values mean "unset"."""


def _slurm_time(value: str) -> str:
    """A time as sbatch --time takes it; UNLIMITED and INFINITE (sbatch's words for no limit) read as
    UNLIMITED. A negative time is refused: `-1` is a typo far more often than a wish for no limit."""
    value = str(value)
    if value.upper() in _NO_LIMIT_WORDS:
        return NO_LIMIT
    if not _TIME_RE.match(value):
        raise ValueError(f"invalid time {clip(value)}; valid: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, "
                         "D-HH:MM:SS, or 0 / UNLIMITED for no limit of the job's own")
    return value


def _slurm_mem(value: str) -> str:
    """8G, or 8GB as people write it: Slurm's own form (8G) is what is kept and rendered."""
    m = _MEM_RE.match(str(value))
    if not m:
        raise ValueError(f"invalid memory {clip(value)}; valid: an integer with optional K, M, G or T (e.g. 8G "
                         "or 8GB)")
    return m.group(1) + m.group(2)


def _env_keys(value: object) -> Any:
    """YAML 1.1 reads an unquoted key ON, NO, YES or TRUE as a boolean and 12 as a number: say so."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"key {clip(key)} is a {type(key).__name__}, not a name: YAML reads unquoted ON/OFF/"
                                 "YES/NO/TRUE/FALSE as booleans and digits as numbers; valid: quote it, e.g. 'ON'")
            if isinstance(item, bool):
                raise ValueError(f"{key}: got the boolean {str(item).lower()}; valid: text, quoted when it reads as "
                                 "yes/no/on/off/true/false, e.g. '1' or 'yes'")
        return {k: str(v) if isinstance(v, (int, float)) else v for k, v in value.items()}
    return value


def _env_names(value: dict[str, str]) -> dict[str, str]:
    for key in value:
        if not _ENV_NAME_RE.match(key):
            raise ValueError(f"invalid environment variable name {clip(key)}; valid: [A-Za-z_][A-Za-z0-9_]*")
    return value


def _env_name_list(value: list[str]) -> list[str]:
    for name in value:
        if not _ENV_NAME_RE.match(name):
            raise ValueError(f"invalid environment variable name {clip(name)}; valid: [A-Za-z_][A-Za-z0-9_]*")
    return list(dict.fromkeys(value))


# sbatch reads #SBATCH lines with its own parser, not bash: a backslash escapes even inside
# quotes, quotes nest, '#' starts a comment and %x patterns are expanded in file names. A value
# that reaches such a line may hold none of them; shlex quoting then means the same to both.
SBATCH_FORBIDDEN = "\\'\"#%"


def sbatch_safe(value: str) -> str:
    bad = sorted({c for c in value if c in SBATCH_FORBIDDEN})
    if bad:
        shown = " ".join(repr(c) for c in bad)
        raise ValueError(f"{clip(value)} holds {shown}, which sbatch's own parser reads specially in an #SBATCH line; "
                         "valid: text without \\ ' \" # % (spaces are fine)")
    return value


def _sbatch_options(value: list[str]) -> list[str]:
    for opt in value:
        if not _SBATCH_OPT_RE.match(opt) or " " in opt:
            raise ValueError(f"invalid sbatch option {clip(opt)}; valid: one --key=value or --flag, without spaces")
        sbatch_safe(opt)
    return value


def _home_path(value: str) -> str:
    # The login node's home is the compute nodes' home on a cluster; a quoted ~ would never expand there.
    expanded = os.path.expanduser(value)
    if expanded.startswith("~"):
        raise ValueError(f"{clip(value)} starts with ~ but names no home folder; valid: an absolute path or ~/...")
    return expanded


def _tilde_resolves(value: str) -> str:
    # Path.expanduser raises on ~nosuchuser; say so at validation, not as a traceback at submit.
    if value.startswith("~") and os.path.expanduser(value).startswith("~"):
        raise ValueError(f"{clip(value)} starts with ~ but names no home folder; "
                         "valid: an absolute path, ~/... or ~user/... of a user that exists")
    return value


def _whole_number_as_text(value: object) -> Any:
    """`time: 90` and `mem: 8000` are numbers in YAML and text to Slurm (minutes, megabytes)."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


SlurmTime = Annotated[str, BeforeValidator(_whole_number_as_text), AfterValidator(_slurm_time)]
SlurmMem = Annotated[str, BeforeValidator(_whole_number_as_text), AfterValidator(_slurm_mem)]
EnvMap = Annotated[dict[str, str], BeforeValidator(_env_keys), AfterValidator(_env_names)]
EnvNames = Annotated[list[str], AfterValidator(_env_name_list)]
"""Names of environment variables (their values are never part of the config)."""
HomePath = Annotated[str, AfterValidator(_home_path)]
"""A path whose leading ~ is expanded on the login node (venv, python)."""
TildePath = Annotated[str, AfterValidator(_tilde_resolves)]
"""A path expanded where it is used (~ and $VARS), whose ~user names a user that exists."""
_GRES_RE = re.compile(r"^[a-z][a-z0-9_-]*(?::[A-Za-z0-9_.-]+)?(?::\d+)?$")


def _gres(value: str) -> str:
    for item in value.split(","):
        if not _GRES_RE.match(item):
            raise ValueError(f"invalid gres item {item!r}; valid: NAME[:TYPE][:COUNT], comma-separated, "
                             "e.g. gpu:a100:4")
    return value


def gres_gpus(gres: str | None) -> int:
    """GPUs per node a --gres value asks for: gpu (1), gpu:4, gpu:a100:4; other GRES count none."""
    total = 0
    for item in (gres or "").split(","):
        parts = item.split(":")
        if parts[0] == "gpu":
            total += int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
    return total


def node_gpus(gpus_per_node: int | None, gpus_per_task: int | None, tasks_per_node: int | None,
              gres: str | None) -> int:
    """GPUs each node gets, however resources ask for them: gpus_per_node, gpus_per_task x
    tasks_per_node, or a gpu gres."""
    if gpus_per_node:
        return gpus_per_node
    if gpus_per_task:
        return gpus_per_task * (tasks_per_node or 1)
    return gres_gpus(gres)


SbatchValue = Annotated[str, AfterValidator(sbatch_safe)]
SbatchPath = Annotated[str, AfterValidator(sbatch_safe), AfterValidator(_tilde_resolves)]
"""A path that reaches an #SBATCH line (run_root: the logs' folder), expanded where it is used."""
Gres = Annotated[str, AfterValidator(_gres)]
"""Text that reaches an #SBATCH line (partition, account, run_root, ...)."""
SbatchOptions = Annotated[list[str], AfterValidator(_sbatch_options)]


def duration_s(value: str) -> int:
    """Seconds in a Slurm duration, read as Slurm reads one everywhere (--time, squeue %L, sacct
    Elapsed): M, M:S, H:M:S, D-H, D-H:M or D-H:M:S."""
    days = 0
    if "-" in value:
        d, value = value.split("-", 1)
        days = int(d)
        hours, minutes, seconds = ([int(p) for p in value.split(":")] + [0, 0, 0])[:3]
    else:
        parts = [int(p) for p in value.split(":")]
        hours, minutes, seconds = {1: (0, parts[0], 0), 2: (0, *parts), 3: tuple(parts)}[len(parts)]
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def time_to_minutes(value: str) -> int:
    """A Slurm time string in whole minutes (rounded up), as Slurm's own parser does; 0 for no limit
    (0 or UNLIMITED: the partition's MaxTime still applies)."""
    return 0 if value == NO_LIMIT else -(-duration_s(value) // 60)
