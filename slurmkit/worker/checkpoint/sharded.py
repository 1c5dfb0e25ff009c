"""Sharded checkpoints through torch.distributed.checkpoint (DCP), inside slurmkit's step-N layout.

A state holding DTensors (FSDP2's parameters and optimizer state, from
torch.distributed.checkpoint.state_dict.get_state_dict) is saved with DCP: every rank writes its own
shard (`__R_0.distcp`) and rank 0 DCP's `.metadata`, into the step's folder, through fsspec (a local
or parallel filesystem and an object store are the same code). What DCP does not do is slurmkit's
(slurmkit.worker.checkpoint.checkpointer): the files are checksummed as they are written (xxh3-128, in the
stream: no second read), every rank's entries are gathered, and the commit marker is written last.
Loading reshards: DCP reads each rank's slices of whatever world size saved it.

What a shared filesystem could hand a rank is never fully unpickled: DCP's `.metadata` (a pickle)
is checked against the manifest's checksum and read with an unpickler that knows DCP's metadata
classes only, and DCP's non-tensor values load with weights_only=True.
"""

from __future__ import annotations

import enum
import io
import os
import pickle
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as tdist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.tensor import DTensor

import slurmkit.worker.checkpoint.crc as record_crc
from slurmkit.jsontypes import JsonObject
from slurmkit.worker.checkpoint.store import (
    DIGEST,
    SHARDED,
    SHARDED_INDEX,
    UPLOAD_PART,
    CheckpointError,
    CheckpointStore,
    Entry,
    HashingStream,
    digest,
)
from slurmkit.worker.checkpoint.threads import any_tensor


def is_sharded(state: object) -> bool:
    """The state holds a DTensor anywhere (it must go through DCP to be saved whole)."""
    return any_tensor(state, lambda t: isinstance(t, DTensor))


class ShardWriter(FsspecWriter):
    """DCP's fsspec writer, with every file it writes checksummed in the stream: `entries` holds
    them (DCP's temporary `.metadata.tmp` under its final name)."""

    def __init__(self, path: str, durable: bool) -> None:
        """durable: fsync every file (a filesystem); an object store's upload is durable once it returns,
        and DCP would fall back to os.sync(), the whole machine's, for a stream without a file."""
        super().__init__(path, sync_files=durable, single_file_per_rank=True, overwrite=True)
        self.entries: list[Entry] = []
        lock = threading.Lock()
        fs = self.fs
        opened = fs.create_stream

        @contextmanager
        def create_stream(p: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
            with opened(p, mode) as raw:
                stream = HashingStream(raw, chunk=UPLOAD_PART, writeback=durable)
                yield stream
                if durable:  # DCP has fsynced it: its pages are clean, and go
                    stream.drop_cache()
            name = os.path.basename(os.fspath(p)).removesuffix(".tmp")
            with lock:
                self.entries.append(Entry(name, stream.hasher.hexdigest(), stream.size))

        fs.create_stream = create_stream  # type: ignore[method-assign,assignment]


# What DCP's .metadata may name: its own dataclasses, and the few torch types they hold.
_SHARDED_INDEX_GLOBALS = {
    ("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("collections", "OrderedDict"),
}


def _enum_member(cls: object, name: object) -> enum.Enum:
    """What Python 3.11.0 to 3.11.3 pickle an enum member as, `getattr(EnumClass, "NAME")`, for an
    enum the unpickler already admitted, and nothing else (3.11.4 on pickle `EnumClass(value)`)."""
    if isinstance(cls, type) and issubclass(cls, enum.Enum) and isinstance(name, str) and name in cls.__members__:
        return cls[name]
    raise pickle.UnpicklingError(f"getattr({cls!r}, {name!r}) is not an enum member of a DCP checkpoint's metadata")


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == dcp_metadata.__name__ or (module, name) in _SHARDED_INDEX_GLOBALS:
            return super().find_class(module, name)
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a DCP checkpoint's metadata")


class ShardReader(FsspecReader):
    """DCP's fsspec reader; `.metadata` must match the manifest's checksum and is read with an
    unpickler that knows DCP's metadata classes only."""

    def __init__(self, path: str, metadata_digest: str) -> None:
        super().__init__(path)
        self.metadata_digest = metadata_digest

    def read_metadata(self, *args: object, **kwargs: object) -> dcp_metadata.Metadata:
        path = self.fs.concat_path(self.path, SHARDED_INDEX)
        with self.fs.create_stream(path, "rb") as stream:
            data = stream.read()
        if digest(data) != self.metadata_digest:
            raise CheckpointError(f"{path}: checksum differs from the commit marker's")
        metadata: dcp_metadata.Metadata = _MetadataUnpickler(io.BytesIO(data)).load()
        if metadata.storage_meta is not None:
            metadata.storage_meta.load_id = self.load_id  # as DCP's own reader does
        return metadata


class _WeightsOnlyPlanner(DefaultLoadPlanner):
    """DCP's planner, but a non-tensor value is loaded weights_only (DCP's own unpickles in full)."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._nested_dict import set_element  # noqa: PLC0415 - private

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def save(state: Mapping[str, object], store: CheckpointStore, step: int,
         group: tdist.ProcessGroup | None) -> list[Entry]:
    """Write `state` (on CPU) as this rank's shard of a DCP checkpoint in step-N; the entries of the
    files this process wrote. Collective over `group` (every rank of the save calls it)."""
    folder = store.step_uri(step)
    writer = ShardWriter(folder, durable=not store.object_store)
    try:
        with record_crc.off():  # each file is checksummed in the stream already
            dcp.save(state, storage_writer=writer, process_group=group)
    except Exception as exc:  # DCP gathers every rank's failure into one CheckpointException
        raise CheckpointError(f"sharded save into {folder} failed: {exc}") from exc
    return writer.entries


def share(names: list[str], rank: int, world_size: int) -> list[str]:
    """The files of a step this rank checks at load: every world_size-th, so each is read by one rank."""
    return sorted(names)[rank::world_size]


def damage(store: CheckpointStore, step: int, manifest: JsonObject, rank: int, world_size: int) -> str | None:
    """What is wrong with this rank's share of a sharded step's files (None: each has its size and
    checksum). The ranks agree on every rank's answer before any of them loads (a load is collective)."""
    files: dict[str, JsonObject] = manifest["files"]
    if DIGEST not in files.get(SHARDED_INDEX, {}):
        return f"{store.step_dir(step)}: the commit marker names no {SHARDED_INDEX} checksum"
    for name in share(list(files), rank, world_size):
        if not store.file_matches(step, name, files[name]):
            return f"{store.step_dir(step)}/{name}: missing, or its size or checksum differs from the commit marker's"
    return None


def load(state: JsonObject, store: CheckpointStore, step: int, manifest: JsonObject) -> None:
    """Fill `state` (DTensors of this run's sharding) from a sharded step saved at any world size,
    once every rank found its share undamaged. Collective over the default group."""
    reader = ShardReader(store.step_uri(step), manifest["files"][SHARDED_INDEX][DIGEST])
    dcp.load(state, storage_reader=reader, planner=_WeightsOnlyPlanner())


def full_state(store: CheckpointStore, step: int) -> dict[str, torch.Tensor]:
    """Every tensor of a sharded step, whole, by its flat name (`model.<fqn>`, `optim.state.<fqn>.exp_avg`),
    in this one process (no process group): to inspect a checkpoint or export it to a single file.
    Every file is checksummed first."""
    manifest = store.verify(step)
    if manifest is None or manifest.get("format") != SHARDED:
        raise CheckpointError(f"{store.step_dir(step)}: not a committed sharded step")
    files: dict[str, JsonObject] = manifest["files"]
    for name in files:
        if not store.file_matches(step, name, files[name]):
            raise CheckpointError(f"{store.step_dir(step)}/{name}: size or checksum differs from the commit marker's")
    reader = ShardReader(store.step_uri(step), files[SHARDED_INDEX][DIGEST])
    index = reader.read_metadata()
    state = {key: torch.empty(meta.size, dtype=meta.properties.dtype)
             for key, meta in index.state_dict_metadata.items() if isinstance(meta, dcp_metadata.TensorStorageMetadata)}
    dcp.load(state, storage_reader=reader, planner=_WeightsOnlyPlanner(), no_dist=True)
    return state
