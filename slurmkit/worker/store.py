"""The key-value store a run's ranks meet on, signed with the run's secret.

torch's TCPStore takes any client that reaches its port, and any client may list, read, set and
delete keys. So every value slurmkit or torch.distributed (gloo's rendezvous, the warm-restart
protocol, the health gate's all-reduce) writes through this store carries an HMAC-SHA256 of its
key and value under the run's secret (slurmkit.common.trust.run_secret), and a value read is
used only when its tag checks out (`get` raises ForgedValue; `valid` says whether it would).
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
from typing import Any

import torch.distributed as tdist

TAG_BYTES = 32


class ForgedValue(RuntimeError):
    """A value in the store that was not written with the run's secret."""


class SignedStore(tdist.Store):
    """A torch.distributed Store over another whose values are signed and checked."""

    def __init__(self, inner: tdist.Store, secret: bytes) -> None:
        super().__init__()
        self.inner, self._secret = inner, secret

    def _tag(self, key: str, value: bytes) -> bytes:
        return hmac.new(self._secret, key.encode() + b"\0" + value, hashlib.sha256).digest()

    def set(self, key: str, value: str | bytes) -> None:
        data = value.encode() if isinstance(value, str) else bytes(value)
        self.inner.set(key, self._tag(key, data) + data)  # type: ignore[arg-type]  # pybind takes bytes too

    def get(self, key: str) -> bytes:
        raw = bytes(self.inner.get(key))
        tag, value = raw[:TAG_BYTES], raw[TAG_BYTES:]
        if len(tag) != TAG_BYTES or not hmac.compare_digest(tag, self._tag(key, value)):
            raise ForgedValue(f"store key {key!r} holds a value not written with the run's secret")
        return value

    def valid(self, key: str) -> bool:
        """The key holds a value written with the run's secret."""
        try:
            return bool(self.inner.check([key])) and self.get(key) is not None
        except (ForgedValue, RuntimeError):
            return False

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
    return SignedStore(inner, secret)
