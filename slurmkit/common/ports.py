"""Every port slurmkit picks for a job, from one table. Each use has its own range and the ranges
are disjoint, so for the same job id no two uses can meet; two jobs sharing a node differ unless
their ids are a multiple of the range's span apart.

    training rendezvous (MASTER_PORT,   [20000, 25000)   20000 + (id + part) % 5000
      or torchrun's c10d endpoint)                       (part: a heterogeneous job's het group, else 0)
    health-gate all-reduce              [25000, 30000)   25000 + id % 5000
    Ray head and its services           [10100, 20000)   10100 + (id % 99) * 100, a block of 100

A local run (the `local` profile) has no job id that other jobs on the machine know of: its
training port is the first in the training range, from a random start, that nothing on the
machine listens on when it is submitted (`free_local_port`), so it cannot meet a Slurm job's
rendezvous on the same host (the dev cluster's nodes are this machine).

Every range lies below Linux's ephemeral ports (32768 and up by default), from which any outgoing
connection on the node takes its local port: a port there may be in use at random when a job asks
to listen on it. Ray's own fixed ports stay outside them: its client server's 10001, 6379, 8265.
"""

from __future__ import annotations

import errno
import random
import socket

from slurmkit.common.slurm_env import base_id
from slurmkit.errors import SlurmkitError

EPHEMERAL_LOW = 32768  # Linux's default net.ipv4.ip_local_port_range starts here
TRAINING = (20000, 5000)
HEALTH = (25000, 5000)
RAY = (10100, 99, 100)  # base, blocks, ports per block


def _number(job_id: str) -> int:
    """The numeric job id (an array task's own id, or ARRAY_TASK's array id)."""
    digits = "".join(c for c in base_id(str(job_id)) if c.isdigit())
    return int(digits or 0)


def training_port(job_id: str, part: int = 0) -> int:
    """`part`: a heterogeneous job's part (its het group), each its own world on the next port."""
    base, span = TRAINING
    return base + (_number(job_id) + part) % span


def health_port(job_id: str) -> int:
    base, span = HEALTH
    return base + _number(job_id) % span


def ray_port_shell(job_id_var: str = "SLURM_JOB_ID") -> str:
    """The Ray head's port as a bash arithmetic expression over the job id variable."""
    base, blocks, size = RAY
    return f"$(( {base} + {job_id_var} % {blocks} * {size} ))"


def _listened_on(port: int) -> bool:
    """Whether binding the loopback or every interface at `port` fails because it is in use."""
    for host in ("127.0.0.1", ""):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store binds
            try:
                sock.bind((host, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
                raise
    return False


def free_local_port(rng: random.Random | None = None) -> int:
    """A training port for a local run: the first port of the training range, from a random
    start, that nothing on this machine listens on now."""
    base, span = TRAINING
    start = (rng or random.SystemRandom()).randrange(span)
    for i in range(span):
        port = base + (start + i) % span
        if not _listened_on(port):
            return port
    raise SlurmkitError(f"no free port in [{base}, {base + span}) on this machine for a local run's rendezvous")
