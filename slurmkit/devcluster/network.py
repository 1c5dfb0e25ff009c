"""The dev cluster's private network: a bridge, one namespace and veth pair per node, /etc/hosts."""

from __future__ import annotations

import subprocess
from pathlib import Path

from slurmkit.common.atomic import atomic_write_text
from slurmkit.devcluster import names
from slurmkit.errors import DevClusterError


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=False)
    if check and proc.returncode != 0:
        raise DevClusterError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def _exists(*args: str) -> bool:
    return _ip(*args, check=False).returncode == 0


def setup(nodes: list[names.Node]) -> None:
    if not _exists("link", "show", names.BRIDGE):
        _ip("link", "add", names.BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{names.CONTROLLER_IP}/24", "dev", names.BRIDGE)
    _ip("link", "set", names.BRIDGE, "up")
    for nd in nodes:
        if not Path(f"/run/netns/{nd.netns}").exists():
            _ip("netns", "add", nd.netns)
        if not _exists("link", "show", nd.veth):
            _ip("link", "add", nd.veth, "type", "veth", "peer", "name", "eth0", "netns", nd.netns)
            _ip("-n", nd.netns, "addr", "add", f"{nd.ip}/24", "dev", "eth0")
        _ip("link", "set", nd.veth, "master", names.BRIDGE, "up")
        _ip("-n", nd.netns, "link", "set", "eth0", "up")
        _ip("-n", nd.netns, "link", "set", "lo", "up")


def teardown(nodes: list[names.Node]) -> None:
    for nd in nodes:
        _ip("link", "del", nd.veth, check=False)
        _ip("netns", "del", nd.netns, check=False)
    if nodes:
        _ip("link", "del", names.BRIDGE, check=False)


def write_hosts(block: str) -> None:
    """Replace the devcluster block in /etc/hosts (an empty block removes it)."""
    text = names.HOSTS_FILE.read_text() if names.HOSTS_FILE.exists() else ""
    if names.HOSTS_BEGIN in text:
        head, _, rest = text.partition(names.HOSTS_BEGIN)
        _, _, tail = rest.partition(names.HOSTS_END + "\n")
        text = head + tail
    new = text + block
    if new != (names.HOSTS_FILE.read_text() if names.HOSTS_FILE.exists() else ""):
        try:
            atomic_write_text(names.HOSTS_FILE, new, mode=0o644)  # every user resolves names through it
        except OSError:
            # /etc/hosts can be a bind mount that refuses rename; write in place then.
            names.HOSTS_FILE.write_text(new)
