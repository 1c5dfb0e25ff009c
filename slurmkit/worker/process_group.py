"""torch.distributed from the Slurm environment (or submitit's local one), with explicit timeouts.

MASTER_ADDR is the first host of the step's nodes ($SLURM_STEP_NODELIST: a job with spare nodes
runs its ranks on some of the job's), expanded in Python (no scontrol on the ranks); MASTER_PORT
comes from slurmkit.common.ports (the training range).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import faulthandler
import json
import os
import re
import socket
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurmkit import trust
from slurmkit.common import ports
from slurmkit.common.slurm_env import expand_hostlist
from slurmkit.worker import at_exit

PORT_BASE = ports.TRAINING[0]  # torchrun or a single process without a job id
DEFAULT_PG_TIMEOUT_S = 600.0
TEARDOWN_S = 60.0
"""The longest rank 0 waits for the others to leave, and a teardown runs before its stacks are dumped."""
FR_BUFFER_NAMES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
"""The flight recorder's buffer size, as torch >= 2.9 names it and as it did before (still read then,
with a deprecation warning)."""


def nccl_defaults(torch_version: str, env: Mapping[str, str]) -> dict[str, str]:
    """The NCCL settings to add to `env`: a user's own value always wins, under either of the flight
    recorder buffer's names."""
    major_minor = tuple(int(n) for n in re.findall(r"\d+", torch_version)[:2])
    defaults = {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",  # tear down the process group on a failed collective
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",  # flight recorder dumps its trace when a collective times out
    }
    if not any(name in env for name in FR_BUFFER_NAMES):  # entries the flight recorder keeps
        defaults[FR_BUFFER_NAMES[0] if major_minor >= (2, 9) else FR_BUFFER_NAMES[1]] = "2000"
    return {key: value for key, value in defaults.items() if key not in env}


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    job_id: str
    launcher: str  # slurm | local | torchrun | single


def detect() -> DistEnv:
    """Rank layout from torchrun, Slurm, submitit's local executor, or a single process.

    torchrun comes first: its ranks, started inside an srun step, see that step's SLURM_PROCID
    too (one task per node), but their rank is torchrun's RANK."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" in env and "RANK" in env and "WORLD_SIZE" in env:
        return _torchrun(env)
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and env.get("SUBMITIT_EXECUTOR") != "local":
        job_id = env.get("SLURM_JOB_ID", "0")  # unique per array task too
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
        addr = env.get("MASTER_ADDR") or (expand_hostlist(nodelist)[0] if nodelist else "127.0.0.1")
        return DistEnv(int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", 0)),
                       int(env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0] or 1), addr,
                       int(env.get("MASTER_PORT") or ports.training_port(job_id)), job_id, "slurm")
    if "SUBMITIT_LOCAL_GLOBALID" in env:
        job_id = env.get("SUBMITIT_LOCAL_JOB_ID", "0")
        n = int(env["SUBMITIT_LOCAL_NTASKS"])
        return DistEnv(int(env["SUBMITIT_LOCAL_GLOBALID"]), n, int(env.get("SUBMITIT_LOCAL_LOCALID", 0)), n,
                       "127.0.0.1", int(env.get("MASTER_PORT") or ports.training_port(job_id)), job_id, "local")
    if "RANK" in env and "WORLD_SIZE" in env:
        return _torchrun(env)
    return DistEnv(0, 1, 0, 1, "127.0.0.1", PORT_BASE, "0", "single")


def _torchrun(env: Mapping[str, str]) -> DistEnv:
    return DistEnv(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)),
                   int(env.get("LOCAL_WORLD_SIZE", 1)), env.get("MASTER_ADDR", "127.0.0.1"),
                   int(env.get("MASTER_PORT", PORT_BASE)), env.get("SLURM_JOB_ID", "0"), "torchrun")


def rank_env(denv: DistEnv) -> dict[str, str]:
    """The variables torch.distributed's env:// rendezvous reads, for a user's own script."""
    return {"MASTER_ADDR": denv.master_addr, "MASTER_PORT": str(denv.master_port), "RANK": str(denv.rank),
            "WORLD_SIZE": str(denv.world_size), "LOCAL_RANK": str(denv.local_rank),
            "LOCAL_WORLD_SIZE": str(denv.local_world_size)}


def _tcp_store(addr: str, port: int, world_size: int, is_main: bool, timeout: dt.timedelta,
               secret: bytes) -> Any:
    """The run's signed store (slurmkit.worker.signed_store.tcp_store; torch.distributed: imported on first use)."""
    from slurmkit.worker.signed_store import tcp_store

    return tcp_store(addr, port, world_size, is_main, timeout, secret)


class Group:
    """The default process group over a store of its own, which outlives it: a warm restart
    (slurmkit.worker.train.warm) aborts the group and builds the next generation on the same store
    (a new key prefix), with no new rendezvous port. Rank 0's process hosts the store."""

    def __init__(self, denv: DistEnv, backend: str, device: Any, timeout: dt.timedelta,
                 secret: bytes | None = None) -> None:
        self.denv, self.backend, self.device, self.timeout = denv, backend, device, timeout
        # Signed with the run's secret: another user who reaches the port cannot feed the ranks a value.
        self.store = _tcp_store(denv.master_addr, denv.master_port, denv.world_size, denv.rank == 0, timeout,
                               secret if secret is not None else run_secret(denv))
        self.generation = 0
        self._pairs: set[tuple[int, str]] = set()
        """gloo's connections to the peers: (fd, the socket's inode as /proc names it)."""
        self._init()

    def _init(self) -> None:
        import torch.distributed as tdist

        before = _socket_fds()
        tdist.init_process_group(self.backend, store=tdist.PrefixStore(f"slurmkit/gen{self.generation}/", self.store),
                                 rank=self.denv.rank, world_size=self.denv.world_size, timeout=self.timeout,
                                 device_id=self.device if self.backend == "nccl" else None)
        at_exit.keep_default_group()  # a DDP reducer must never free it: see there
        # gloo connects every pair of ranks while the group is made: the sockets that appeared, minus the store's.
        self._pairs = {(fd, ident) for fd, ident in (_socket_fds().items() - before.items())
                       if _is_peer(fd, self.denv.master_port)}

    def abort(self) -> None:
        """Close this rank's connections to its peers, then destroy the group: a peer blocked in a
        gloo collective with this rank fails at once ("Connection closed by peer").

        gloo has no abort that does this: in torch 2.13 ProcessGroupGloo.abort() and shutdown(),
        like destroy_process_group(), leave the connections open while anything still holds the
        group, and DDP's reducer does. Shutting its sockets down is what reaches the peers."""
        import torch.distributed as tdist

        now = _socket_fds()
        for fd, ident in self._pairs:
            if now.get(fd) != ident:  # gloo closed it already (its peer went first); the number may be reused
                continue
            # A dup: gloo still owns (and closes) the fd.
            with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        self._pairs = set()
        if tdist.is_initialized():
            tdist.destroy_process_group()

    def rebuild(self) -> None:
        """The next generation of the group, once every rank has aborted its own."""
        self.abort()
        self.generation += 1
        self._init()


def broadcast_json(value: Any, device: str = "cpu") -> Any:
    """Rank 0's JSON-able `value` on every rank, sent as JSON bytes in tensors: unlike
    broadcast_object_list, nothing received is unpickled."""
    import torch
    import torch.distributed as tdist

    data = json.dumps(value).encode() if tdist.get_rank() == 0 else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    tdist.broadcast(size, 0)
    buf = (torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device) if data
           else torch.empty(int(size.item()), dtype=torch.uint8, device=device))
    tdist.broadcast(buf, 0)
    return json.loads(bytes(buf.cpu().tolist()))


def gather_json(value: Any, device: str = "cpu") -> list[Any]:
    """Every rank's JSON-able `value`, in rank order, on every rank (JSON bytes: nothing unpickled)."""
    import torch
    import torch.distributed as tdist

    data = json.dumps(value).encode()
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(tdist.get_world_size())]
    tdist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64, device=device))
    longest = max(int(t.item()) for t in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8, device=device)
    mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    bufs = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in sizes]
    tdist.all_gather(bufs, mine)
    return [json.loads(bytes(b[:int(n.item())].cpu().tolist())) for b, n in zip(bufs, sizes, strict=True)]


@dataclass(frozen=True)
class Ranks:
    """The ranks that agree on a checkpoint or a stop, and the small collectives that takes (JSON
    values only: nothing a peer sends is unpickled)."""

    rank: int = 0
    world_size: int = 1
    device: str = "cpu"

    @classmethod
    def of(cls, dist: Dist) -> Ranks:
        return cls(dist.rank, dist.world_size, dist.device_str)

    @classmethod
    def current(cls) -> Ranks:
        """The initialised process group's (a user's function brought it up), else one rank."""
        import torch.distributed as tdist

        if tdist.is_available() and tdist.is_initialized():
            return cls(tdist.get_rank(), tdist.get_world_size(), "cuda" if tdist.get_backend() == "nccl" else "cpu")
        return cls()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def gather(self, value: Any) -> list[Any]:
        """Every rank's value, in rank order (a tuple comes back a list)."""
        return [value] if self.world_size == 1 else gather_json(value, self.device)

    def from_main(self, value: Any) -> Any:
        """Rank 0's value."""
        return value if self.world_size == 1 else broadcast_json(value, self.device)

    def max(self, values: list[int]) -> list[int]:
        """The largest of each value over the ranks: one small all-reduce."""
        if self.world_size == 1:
            return values
        import torch
        import torch.distributed as tdist

        t = torch.tensor(values, dtype=torch.int64, device=self.device)
        tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
        return [int(v) for v in t.tolist()]


def run_secret(denv: DistEnv) -> bytes:
    """The run's secret (trust.run_secret) from its run folder; a process group started outside a
    slurmkit run keeps one per job id in ~/.slurmkit/secrets, private, on the shared home."""
    folder = os.environ.get("SLURMKIT_RUN_DIR")
    if not folder:
        home = Path.home() / ".slurmkit" / "secrets"
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder = str(home / f"job-{denv.job_id}")
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
    return trust.run_secret(folder)


def _socket_fds() -> dict[int, str]:
    """This process's sockets: fd -> "socket:[inode]"."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{name}")
            if target.startswith("socket:"):
                found[int(name)] = target
    return found


def _is_peer(fd: int, store_port: int) -> bool:
    """A connected socket, neither end of it on the store's port (a listener has no peer)."""
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            return store_port not in (sock.getsockname()[1], sock.getpeername()[1])
    except OSError:
        return False


@dataclass(frozen=True)
class Dist:
    """What a task needs from the process group."""

    env: DistEnv
    backend: str
    device_str: str
    group: Group | None = field(default=None, compare=False)
    """The group this process brought up over its own store; None for one rank, under torchrun
    (its agent owns the store) or inside a group someone else initialised."""

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def is_main(self) -> bool:
        return self.env.rank == 0


def _cpu_threads(local_world: int) -> int:
    slurm = os.environ.get("SLURM_CPUS_PER_TASK")
    if slurm and slurm.isdigit():
        return int(slurm)
    return max(1, len(os.sched_getaffinity(0)) // max(1, local_world))


@contextmanager
def distributed(timeout_s: float | None = None) -> Iterator[Dist]:
    """Initialise the process group (NCCL on GPUs, gloo otherwise) and always tear it down."""
    import torch
    import torch.distributed as tdist

    denv = detect()
    timeout = timeout_s or float(os.environ.get("SLURMKIT_PG_TIMEOUT_S", DEFAULT_PG_TIMEOUT_S))
    if torch.cuda.is_available():
        backend = "nccl"
        os.environ.update(nccl_defaults(torch.__version__, os.environ))
        device = torch.device("cuda", denv.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        backend = "gloo"
        device = torch.device("cpu")
        torch.set_num_threads(_cpu_threads(denv.local_world_size))
    os.environ.update(rank_env(denv))
    owns_group = denv.world_size > 1 and not tdist.is_initialized()
    group: Group | None = None
    if owns_group and denv.launcher == "torchrun":
        # torchrun's agent hosts the store at MASTER_ADDR:MASTER_PORT (else rank 0 does, as env://
        # would); the group's values are signed with the run's secret as on srun, while torchrun's
        # own rendezvous keys stay torchrun's.
        hosts = denv.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
        store = _tcp_store(denv.master_addr, denv.master_port, denv.world_size, hosts,
                           dt.timedelta(seconds=timeout), run_secret(denv))
        tdist.init_process_group(backend, store=tdist.PrefixStore(f"slurmkit/torchrun/{denv.job_id}/", store),
                                 rank=denv.rank, world_size=denv.world_size, timeout=dt.timedelta(seconds=timeout),
                                 device_id=device if backend == "nccl" else None)
        at_exit.keep_default_group()
    elif owns_group:
        group = Group(denv, backend, device, dt.timedelta(seconds=timeout))
    together = False
    try:
        yield Dist(denv, backend, str(device), group)
        if owns_group:
            # Leave together: a rank whose peers (or the store on rank 0) vanish mid-teardown can
            # abort at exit ("terminate called without an active exception").
            tdist.barrier()
            together = True
    finally:
        if together:
            _leave(denv, group.store if group is not None else store)
        elif owns_group and tdist.is_initialized():  # a failure: the peers may be gone, nobody waits
            tdist.destroy_process_group()


def _leave(denv: DistEnv, store: Any) -> None:
    """Destroy the group after a clean end; the rank that hosts the store (rank 0) leaves last.

    CI once saw rank 1 never return from its teardown after rank 0, the store's host, had exited
    (the job RUNNING with every step done). So every other rank says in the store when its group is
    gone, and rank 0 waits for them, at most TEARDOWN_S. Should a teardown hang anyway, every thread's
    stack goes to the rank's log after TEARDOWN_S (faulthandler's own thread: it needs no GIL)."""
    import torch.distributed as tdist

    faulthandler.dump_traceback_later(TEARDOWN_S, exit=False)
    try:
        if tdist.is_initialized():  # a warm restart that failed to rebuild leaves none
            tdist.destroy_process_group()
        if denv.rank:
            store.set(f"slurmkit/left/{denv.rank}", b"1")
        else:
            with contextlib.suppress(Exception):  # a rank gone without a word: leave all the same
                store.wait([f"slurmkit/left/{r}" for r in range(1, denv.world_size)], dt.timedelta(seconds=TEARDOWN_S))
    except Exception as exc:  # the store's host already gone: nothing to tell it
        print(f"slurmkit: rank {denv.rank}: teardown: {exc}", file=sys.stderr, flush=True)
    finally:
        faulthandler.cancel_dump_traceback_later()
