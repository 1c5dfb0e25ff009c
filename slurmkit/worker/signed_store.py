"""The key-value store a run's ranks meet on, signed with the run's secret.

torch's TCPStore takes any client that reaches its port, and any client may list, read, set and
delete keys. So every value slurmkit or torch.distributed (gloo's rendezvous, the warm-restart
protocol, the health gate's all-reduce) writes through this store carries an HMAC-SHA256 of its
key and value under the run's secret (slurmkit.trust.run_secret), and a value read is
used only when its tag checks out (`get` waits past a forged value, `peek` never waits).
Another user on the node who knows the port can still delete or overwrite keys, which makes the
protocol fail safe (the cold path), but cannot make a rank act on a value of theirs. Values are
signed, not hidden. Rank 0's store listens only on the address the ranks use (MASTER_ADDR;
bind_address says when it cannot).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import socket
import time
from typing import Any

import torch.distributed as tdist

TAG_BYTES = 32
FORGED_POLL_S = 0.05


class ForgedValue(RuntimeError):
    """A value in the store that was not written with the run's secret."""


class SignedStore(tdist.Store):
    """A torch.distributed Store over another whose values are signed and checked."""

    def __init__(self, inner: tdist.TCPStore, secret: bytes, timeout: dt.timedelta) -> None:
        super().__init__()
        self.inner, self._secret, self._timeout_s = inner, secret, timeout.total_seconds()

    def _tag(self, key: str, value: bytes) -> bytes:
        return hmac.new(self._secret, key.encode() + b"\0" + value, hashlib.sha256).digest()

    def set(self, key: str, value: str | bytes) -> None:
        data = value.encode() if isinstance(value, str) else bytes(value)
        self.inner.set(key, self._tag(key, data) + data)  # type: ignore[arg-type]  # pybind takes bytes too

    def _verified(self, key: str, raw: bytes) -> bytes | None:
        tag, value = raw[:TAG_BYTES], raw[TAG_BYTES:]
        return value if len(tag) == TAG_BYTES and hmac.compare_digest(tag, self._tag(key, value)) else None

    def get(self, key: str) -> bytes:
        """The value at `key` once it is one written with the run's secret: a forged value planted
        ahead (a rendezvous key of the next generation) is waited past, as a missing one is, until
        the writer's own replaces it or the store's timeout ends (ForgedValue)."""
        deadline = time.monotonic() + self._timeout_s
        while (value := self._verified(key, bytes(self.inner.get(key)))) is None:
            if time.monotonic() > deadline:
                raise ForgedValue(f"store key {key!r} holds a value not written with the run's secret")
            time.sleep(FORGED_POLL_S)
        return value

    def peek(self, key: str) -> bytes | None:
        """The value at `key` now, if there is one written with the run's secret; never waits."""
        return self._verified(key, bytes(self.inner.get(key))) if self.inner.check([key]) else None

    # Counters and waits carry no value to sign; they pass through.
    def add(self, key: str, amount: int) -> int:
        return int(self.inner.add(key, amount))

    def check(self, keys: list[str]) -> bool:
        return bool(self.inner.check(keys))

    def wait(self, keys: list[str], timeout: dt.timedelta | None = None) -> None:
        if timeout is None:
            self.inner.wait(keys)
        else:
            self.inner.wait(keys, timeout)

    def delete_key(self, key: str) -> bool:
        return bool(self.inner.delete_key(key))

    def num_keys(self) -> int:
        return int(self.inner.num_keys())

    def set_timeout(self, timeout: dt.timedelta) -> None:
        self._timeout_s = timeout.total_seconds()
        self.inner.set_timeout(timeout)


def bind_address(addr: str) -> str:
    """The address rank 0 listens on: MASTER_ADDR's. Where a host name resolves to loopback on its
    own host (Debian's 127.0.1.1 line in /etc/hosts) while it names a node others reach, binding
    there would shut the other nodes out: then every interface, and the signatures alone guard."""
    ip = socket.gethostbyname(addr)
    named_loopback = ip.startswith("127.") and addr not in ("localhost",) and not addr.startswith("127.")
    return "" if named_loopback else ip


def tcp_store(addr: str, port: int, world_size: int, is_main: bool, timeout: dt.timedelta,
              secret: bytes) -> SignedStore:
    """The run's store: rank 0 listens on `addr` only (not every interface), the others connect."""
    listen_fd: Any = None
    if is_main:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bind_address(addr), port))
        sock.listen(1024)
        listen_fd = sock.detach()  # the store owns it from here
    inner = tdist.TCPStore(addr, port, world_size, is_main, timeout=timeout, master_listen_fd=listen_fd)
    return SignedStore(inner, secret, timeout)
