"""The checkpoint store's storage seam: what CheckpointStore needs of a storage, and opening one
from a URI. Every fsspec filesystem has it (a folder, file://, s3://, memory://, ...); a store
behind another client fits by the same few methods."""

from __future__ import annotations

from typing import Any, Protocol

import fsspec


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; older committed checkpoints are untouched."""


class Storage(Protocol):
    """What the step-N store reads and writes through (fsspec's AbstractFileSystem's names)."""

    protocol: str | tuple[str, ...]

    def ls(self, path: str, detail: bool = ...) -> list[Any]: ...

    def exists(self, path: str) -> bool: ...

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes: ...

    def pipe_file(self, path: str, value: bytes) -> None: ...

    def makedirs(self, path: str, exist_ok: bool = False) -> None: ...

    def open(self, path: str, mode: str = "rb", **kwargs: object) -> Any: ...

    def rm(self, path: str, recursive: bool = False) -> None: ...

    def unstrip_protocol(self, name: str) -> str: ...


def open_storage(uri: str) -> tuple[Storage, str]:
    """The storage a URI names and the root path in it; a protocol whose package is missing, or
    one fsspec does not know, is one CheckpointError."""
    try:
        fs, root = fsspec.core.url_to_fs(uri)
    except ImportError as exc:  # fsspec names the package a protocol needs: "Install s3fs to access S3"
        extra = " (pip install 'slurmkit[s3]')" if uri.startswith("s3://") else ""
        raise CheckpointError(f"{uri.split('://')[0]}:// needs a package not installed: {exc}{extra}") from exc
    except ValueError as exc:  # "Protocol not known: nosuch"
        raise CheckpointError(f"{exc}; valid: a folder, file://, s3:// or another fsspec URI") from exc
    return fs, root
