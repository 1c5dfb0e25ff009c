"""Validators shared by the profile and run-spec models."""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationInfo, field_validator

_TIME_RE = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^\d+-\d+$")
_MEM_RE = re.compile(r"^\d+[KMGT]?$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SBATCH_OPT_RE = re.compile(r"^--[a-z][a-z0-9-]*(=.+)?$", re.DOTALL)


class Strict(BaseModel):
    """Every model refuses unknown keys, so a typo is an error rather than a silent default."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)
    multiline_fields: ClassVar[frozenset[str]] = frozenset()
    """Fields never rendered into the script, where newlines are legitimate."""

    @field_validator("*", mode="after")
    @classmethod
    def _one_line_values(cls, value: Any, info: ValidationInfo) -> Any:
        # A newline inside an #SBATCH value would start a new shell line; refuse it at the source.
        if info.field_name not in cls.multiline_fields and _has_control(value):
            raise ValueError("control characters (newline, tab, NUL, ...) are not allowed; valid: one line of text")
        return value


def _has_control(value: Any) -> bool:
    if isinstance(value, str):
        return any(ord(c) < 32 or ord(c) == 127 for c in value)
    if isinstance(value, dict):
        return any(_has_control(k) or _has_control(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_has_control(v) for v in value)
    return False


def _slurm_time(value: str) -> str:
    value = str(value)
    if not _TIME_RE.match(value):
        raise ValueError(
            f"invalid time {value!r}; valid: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
        )
    return value


def _slurm_mem(value: str) -> str:
    value = str(value)
    if not _MEM_RE.match(value):
        raise ValueError(f"invalid memory {value!r}; valid: an integer with optional K, M, G or T (e.g. 8G)")
    return value


def _env_names(value: dict[str, str]) -> dict[str, str]:
    for key in value:
        if not _ENV_NAME_RE.match(key):
            raise ValueError(f"invalid environment variable name {key!r}; valid: [A-Za-z_][A-Za-z0-9_]*")
    return {k: str(v) for k, v in value.items()}


def _sbatch_options(value: list[str]) -> list[str]:
    for opt in value:
        if not _SBATCH_OPT_RE.match(opt) or "\n" in opt:
            raise ValueError(f"invalid sbatch option {opt!r}; valid: --key=value or --flag on one line")
    return value


SlurmTime = Annotated[str, AfterValidator(_slurm_time)]
SlurmMem = Annotated[str, AfterValidator(_slurm_mem)]
EnvMap = Annotated[dict[str, str], AfterValidator(_env_names)]
SbatchOptions = Annotated[list[str], AfterValidator(_sbatch_options)]


def time_to_minutes(value: str) -> int:
    """Convert a Slurm time string to whole minutes (rounded up), as Slurm's own parser does."""
    days = 0
    if "-" in value:
        d, value = value.split("-", 1)
        days = int(d)
        parts = [int(p) for p in value.split(":")]
        hours, minutes, seconds = (parts + [0, 0, 0])[:3]
    else:
        parts = [int(p) for p in value.split(":")]
        if len(parts) == 1:
            hours, minutes, seconds = 0, parts[0], 0
        elif len(parts) == 2:
            hours, minutes, seconds = 0, parts[0], parts[1]
        else:
            hours, minutes, seconds = parts
    total_s = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    return -(-total_s // 60)
