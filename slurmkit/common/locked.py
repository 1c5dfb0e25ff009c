"""A JSON file holding one pydantic model, read and changed under a file lock (LockedJson), and the
base of every such record (Record). run.json (common.record), sweep.json and arrays.json
(common.sweep_layout) are LockedJson files: each has this one reader and this one writer.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from slurmkit import trust
from slurmkit.common import perms
from slurmkit.common.atomic import atomic_write_text
from slurmkit.errors import RunNotFoundError, SlurmkitError, clip
from slurmkit.jsontypes import JsonObject

MAX_RECORD_BYTES = 64 << 20  # a record holds a script and restarts: far below this; a larger file is not one


class Record(BaseModel):
    """A record's fields are typed and checked on read and on assignment. Fields a newer slurmkit
    wrote are kept through a rewrite (extra="allow"); mypy's pydantic plugin keeps slurmkit's own
    code to the declared fields."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    def as_json(self) -> JsonObject:
        """The record as its file holds it: unset optional fields (None) left out."""
        return self.model_dump(mode="json", exclude_none=True)


M = TypeVar("M", bound=Record)


def assign(record: Record, changes: Mapping[str, object]) -> None:
    """Set declared fields of record, each checked; a name the model does not declare is a TypeError,
    as a typo would otherwise land as an extra field nobody reads."""
    unknown = sorted(set(changes) - set(type(record).model_fields))
    if unknown:
        raise TypeError(f"{type(record).__name__} has no field {', '.join(unknown)}")
    for field, value in changes.items():
        setattr(record, field, value)


def try_lock(path: Path) -> int:
    """A descriptor holding `path`'s exclusive lock, taken without waiting (BlockingIOError: another
    holds it). The kernel drops the lock once every descriptor sharing it is closed: with its
    holders, however they die (a child given it with pass_fds holds it too)."""
    # O_NOFOLLOW: a lock file planted as a symlink must not create or open a file elsewhere.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


class CorruptRecordError(SlurmkitError):
    """A run.json, sweep.json or arrays.json that is not a record of its kind."""


class LockedJson(Generic[M]):
    """A JSON file of one model, read and updated under a file lock, so concurrent writers never lose an update."""

    model: type[M]
    missing_error: ClassVar[str] = "no such file"
    indent: ClassVar[int | None] = 1
    sort_keys: ClassVar[bool] = True

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # O_NOFOLLOW: a lock file planted as a symlink must not create or open a file elsewhere.
        fd = os.open(self.path.parent / f".{self.path.name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "r+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def read(self) -> M:
        """The record, read from a file of the caller's own (checked on the open file), of at most
        MAX_RECORD_BYTES; a record of the wrong shape is a CorruptRecordError naming the field.
        Parsed and checked in one pass (pydantic's own JSON parser: a 100,000-task manifest in
        about 0.6 s, where json.loads and then validating took 1 s)."""
        valid = "valid: a JSON object; move the file away to drop the record"
        try:
            text = trust.read_own(self.path, MAX_RECORD_BYTES)
        except FileNotFoundError as exc:
            raise RunNotFoundError(self.missing_error, where=str(self.path.parent)) from exc
        except (OSError, ValueError, trust.NotOwnError) as exc:  # ValueError: not UTF-8
            what = exc.what if isinstance(exc, trust.NotOwnError) else clip(str(exc))
            raise CorruptRecordError(f"unreadable: {what}", where=str(self.path), valid=valid) from exc
        try:
            return self.model.model_validate_json(text)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            if first["type"] == "json_invalid":
                raise CorruptRecordError(f"unreadable: {first['msg']}", where=str(self.path), valid=valid) from exc
            if not first["loc"]:
                raise CorruptRecordError(f"holds {clip(first['input'])}, not a record", where=str(self.path),
                                         valid=valid) from exc
            field = str(first["loc"][0])
            shown = first["input"] if len(first["loc"]) == 1 else f"{first['loc'][1:]}: {first['input']!r}"
            raise CorruptRecordError(f"{field} is {clip(shown)}: {first['msg']}", where=f"{self.path}:{field}",
                                     valid="valid: a record slurmkit wrote; move the file away to drop it") from exc

    def _save(self, record: M) -> None:
        text = json.dumps(record.as_json(), indent=self.indent, sort_keys=self.sort_keys) + "\n"
        atomic_write_text(self.path, text, perms.file_mode(self.path.parent))

    def create(self, record: M) -> bool:
        """Write `record` only if the file does not exist yet; False when someone else was first."""
        with self._locked():
            if self.path.exists():
                return False
            self._save(record)
            return True

    def update(self, **changes: object) -> M:
        """Set fields (each checked against the model) in one locked write; the record written."""
        with self.editing() as record:
            assign(record, changes)
        return record

    @contextmanager
    def editing(self) -> Iterator[M]:
        """Read, let the caller change the record in place, write it back; all under the lock."""
        with self._locked():
            record = self.read()
            yield record
            self._save(record)
