"""The one checkpointer, under the Trainer (slurmkit.worker.train.trainer_ft) and slurmkit.Checkpoint alike.

At a step boundary every rank hands it its share of a save. It copies that to host memory (a waited
save's sharded CPU state needs no copy), writes it in the background (one save in flight), and
commits it at a later boundary, once no rank is still writing (the StopCoordinator's `writing`
vote): every rank's file entries are gathered, rank 0 writes the commit marker (from then on step-N
is valid: slurmkit.worker.checkpoint.store) and prunes to the newest keep_latest_k verified steps.
restore() has rank 0 pick the newest valid step and every rank load it through the caller's `load`;
a step that fails to load on any rank is skipped by all, for the next older one. With `host_copy`,
every rank also keeps the last committed state in its memory: a warm restart's source
(slurmkit.worker.train.warm).

Collectives are JSON only (slurmkit.worker.process_group.Ranks): nothing a peer sends is unpickled.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from slurmkit.common.layout import RunPaths
from slurmkit.errors import squash
from slurmkit.jsontypes import StateDict
from slurmkit.worker import at_exit
from slurmkit.worker.checkpoint.store import SHARDED, CheckpointError, CheckpointStore, Entry
from slurmkit.worker.checkpoint.threads import AsyncWriter, Prefetch, cpu_copy, on_device, reserve
from slurmkit.worker.process_group import Ranks

T = TypeVar("T")
OnFile = Callable[[int, str], None]
"""Called in the writer thread after each file of a save (fault injection: slurmkit.worker.train.faults)."""


def checkpoint_uri(run_dir: str | None) -> str | None:
    """The run's checkpoint URI: the profile's checkpoint_root for it, else the run folder's."""
    if os.environ.get("SLURMKIT_CHECKPOINT_URI"):
        return os.environ["SLURMKIT_CHECKPOINT_URI"]
    return RunPaths(Path(run_dir)).checkpoint_uri(None) if run_dir else None


def dcp_io_module() -> ModuleType:
    """slurmkit.worker.checkpoint.sharded (torch.distributed.checkpoint): imported only where a sharded state is."""
    import slurmkit.worker.checkpoint.sharded as sharded

    return sharded


@dataclass
class HostCopy:
    """The state of a committed step (or the start's), in this rank's memory: a warm restart's source."""

    step: int
    files: StateDict
    """Every file of a save, as this rank took it."""
    on_disk: bool
    """A committed checkpoint holds the same (False: the initial state of a fresh start)."""


class StepFiles:
    """The files of one committed step, for a `load` callback: their names, and each one loaded."""

    def __init__(self, store: CheckpointStore, step: int, verified: dict[str, bytes], ranks: Ranks) -> None:
        self.store, self.step, self._verified, self.ranks = store, step, verified, ranks
        self._manifest = store.manifest(step) or {}
        self.names: frozenset[str] = frozenset(self._manifest.get("files", {}))

    def load(self, name: str) -> Any:
        """One file as tensors (weights_only), from the bytes already verified where there are any."""
        return self.store.load(self.step, name, self._verified.pop(name, None))

    @property
    def sharded(self) -> bool:
        """The step holds a DCP checkpoint (load it with load_sharded)."""
        return self._manifest.get("format") == SHARDED

    def load_sharded(self, state: Mapping[str, object]) -> None:
        """Fill `state` (DTensors of this run's sharding, as get_state_dict gives them) from the step's
        DCP shards, resharded from whatever world size saved them; every rank calls it."""
        dcp_io = dcp_io_module()
        if not self.sharded:
            raise CheckpointError(f"step-{self.step} holds no sharded state (saved without DTensors)")
        # Each rank checksums its share of the files: the step is read once in all, not once a rank.
        damage = dcp_io.damage(self.store, self.step, self._manifest, self.ranks.rank, self.ranks.world_size)
        found = [d for d in self.ranks.gather(damage) if d]
        if found:
            raise CheckpointError(found[0])
        dcp_io.load(state, self.store, self.step, self._manifest)


class Checkpointer:
    def __init__(self, uri: str, ranks: Ranks, required: tuple[str, ...] = (), *, keep_latest_k: int = 3,
                 prefetch: Prefetch | None = None, on_file: OnFile | None = None,
                 heartbeat: Callable[[], None] | None = None, host_copy: bool = False) -> None:
        """prefetch: the search for the newest valid step, started early (else at restore);
        heartbeat: called every second while waiting for a write (a save is progress, not a hang)."""
        self.ranks = ranks
        self.store = CheckpointStore(uri, required)
        self.prefetch = prefetch
        self.writer = AsyncWriter(self.store, on_file)
        self.keep, self.heartbeat, self.host_copy = keep_latest_k, heartbeat, host_copy
        self.resumed_step: int | None = None
        self.stall_s = 0.0
        """Seconds the training thread spent in saves and commits (goodput's checkpoint stall)."""
        self.committed: HostCopy | None = None
        self._in_flight: HostCopy | None = None
        # Two sets of copy memory: the host copy's stays untouched while the next save is taken.
        self._buffers: tuple[StateDict, StateDict] = ({}, {})
        self._slot = 0
        self._shard_buffers: StateDict = {}  # a sharded save's host copy, the same memory each save
        self._sharded = False  # the save in flight has DCP shards
        self._group: Any = None
        self._reserving: threading.Thread | None = None

    @property
    def writing(self) -> bool:
        """This rank's share of a save is still being written (its vote at a step boundary)."""
        return self.writer.pending and not self.writer.done

    # --------------------------------------------------------------- restore

    def restore(self, load: Callable[[StepFiles], T]) -> tuple[int, T] | None:
        """The newest valid step and what `load` made of it on this rank, or None: a fresh start."""
        prefetch, self.prefetch = self.prefetch or Prefetch(self.store), None
        found, verified = prefetch.result()
        if self.ranks.is_main:
            for message in prefetch.messages:
                print(message, flush=True)
        step = self.ranks.from_main(found)
        while step is not None:
            if step != found:  # this rank sees storage differently from rank 0: read what rank 0 verified
                verified = {}
            value: Any = None
            try:
                value = load(StepFiles(self.store, step, verified, self.ranks))
                error = ""
            except Exception as exc:  # noqa: BLE001 - any load failure means: try an older checkpoint
                error = f"{type(exc).__name__}: {squash(str(exc), 200, tail=False)}"
            errors = [e for e in self.ranks.gather(error) if e]
            if not errors:
                self.resumed_step = step
                if self.ranks.is_main:
                    print(f"slurmkit: resumed from checkpoint step-{step}", flush=True)
                return step, value
            self.store.reject(step)
            older = self.store.latest_valid(below=step) if self.ranks.is_main else None
            if self.ranks.is_main:
                print(f"slurmkit: checkpoint step-{step} does not load ({errors[0]}); falling back to "
                      f"{f'step-{older}' if older is not None else 'a fresh start'}", flush=True)
            step, found, verified = self.ranks.from_main(older), None, {}
        return None

    def keep_start(self, step: int | None, files: Mapping[str, object]) -> None:
        """With a host copy: the state training starts from is the first (a fresh start's: not on disk)."""
        if self.host_copy:
            self.committed = HostCopy(step or 0, cpu_copy(files, self._host_memory()), step is not None)
            self._slot ^= 1

    def back_to_committed(self) -> HostCopy:
        """The host copy of the last committed state, for a warm restart; a save in flight is dropped
        uncommitted (its folder has no marker)."""
        assert self.committed is not None, "keep_start() keeps the first host copy"
        self.writer.abandon()
        self._in_flight = None
        if self.committed.on_disk:
            self.resumed_step = self.committed.step
        return self.committed

    # --------------------------------------------------------------- save and commit

    def reserve(self, state: Callable[[], tuple[StateDict, StateDict | None]]) -> None:
        """Allocate the host memory of a save of state()'s files and sharded state (as save() will name
        them) in a thread, once, ahead of the first save: pinning a large state would otherwise stall
        that save. state() is called here, once."""
        if self._reserving is not None:
            return
        files, sharded = state()

        def work() -> None:
            try:
                reserve(files, self._buffers[self._slot])
                if sharded is not None:
                    reserve(sharded, self._shard_buffers)
            except Exception:  # noqa: BLE001 - only memory made early: the save allocates what is missing
                pass

        self._reserving = at_exit.daemon(work, "slurmkit-ckpt-reserve")

    def _host_memory(self) -> StateDict:
        """The set of copy memory the next copy goes into, once reserve()'s thread is done with it."""
        if self._reserving is not None:
            self._reserving.join()
        return self._buffers[self._slot]

    def save(self, step: int, files: Mapping[str, object], wait: bool, mine: Collection[str] | None = None,
             sharded: StateDict | None = None) -> None:
        """Start this rank's share of step's save: `files` copied to host memory, those named in `mine`
        (all by default) written in the background, and `sharded` (a state of DTensors) as this
        rank's shard of a DCP checkpoint in the same step (slurmkit.worker.checkpoint.sharded). Every rank calls
        it at the same step; `wait` commits before returning. A save still pending is committed first.

        A waited save's sharded state on the CPU is written from the state itself, with no host copy:
        training does not go on before it is committed (the stop's save, where the grace time runs).
        `files` are always copied: torch.save writes a view's whole storage, the copy its own bytes."""
        t0 = time.perf_counter()
        if self.writer.pending:
            self._commit()
        taken = cpu_copy(files, self._host_memory())
        if self.host_copy:
            self._in_flight = HostCopy(step, taken, True)
        shards = None
        if sharded is not None:
            dcp_io = dcp_io_module()
            live = wait and not on_device(sharded)  # DCP writes each tensor's own bytes, a view's too
            staged, group = sharded if live else cpu_copy(sharded, self._shard_buffers), self._dcp_group()
            shards = lambda: dcp_io.save(staged, self.store, step, group)  # noqa: E731 - runs in the writer thread
        self._sharded = sharded is not None
        self.writer.start(step, taken if mine is None else {n: taken[n] for n in mine}, shards)
        if wait:
            self._commit()
        self.stall_s += time.perf_counter() - t0

    def _dcp_group(self) -> Any:
        """A gloo group of the same ranks for DCP's collectives in the writer thread: on the training
        thread's group they would interleave with its own. Made at the first sharded save, which every
        rank reaches at the same step."""
        import torch.distributed as tdist

        if self._group is None and self.ranks.world_size > 1:
            self._group = tdist.new_group(backend="gloo")
        return self._group

    def at_boundary(self, any_writing: bool) -> None:
        """Commit the save in flight once no rank is still writing it (as the ranks agreed)."""
        if self.writer.pending and not any_writing:
            t0 = time.perf_counter()
            self._commit()
            self.stall_s += time.perf_counter() - t0

    def _commit(self) -> None:
        step = self.writer.step
        error = None
        entries: list[Entry] = []
        try:
            entries = self.writer.result(heartbeat=self.heartbeat)
        except CheckpointError as exc:
            error = str(exc)
        gathered = self.ranks.gather(([e.__dict__ for e in entries], error))
        errors = [err for _, err in gathered if err]  # the same list on every rank
        if not errors:
            commit_error = None
            if self.ranks.is_main:
                try:
                    assert step is not None
                    all_entries = [Entry(**e) for rank_entries, _ in gathered for e in rank_entries]
                    meta = {"world_size": self.ranks.world_size, "time": time.time(),
                            **({"format": SHARDED} if self._sharded else {})}
                    self.store.commit(step, all_entries, meta)
                    self.store.prune(self.keep, protect=(step, self.resumed_step))
                except (CheckpointError, OSError) as exc:
                    commit_error = str(exc)
            commit_error = self.ranks.from_main(commit_error)
            errors = [commit_error] if commit_error else []
        self._in_flight, in_flight = None, self._in_flight
        if errors:
            raise CheckpointError(errors[0])
        if in_flight is not None:  # the committed state is now the host copy; the older one's memory is free
            self.committed = in_flight
            self._slot ^= 1
        if self.ranks.is_main:
            print(f"slurmkit: checkpoint step-{step} committed", flush=True)

    def finish(self) -> None:
        """Commit a save still in flight; raise its error if it failed."""
        if self.writer.pending:
            self._commit()
