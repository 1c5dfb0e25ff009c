"""The ranks' store needs the run's secret: another user's process on the node that knows the port
can connect, list and set keys, yet cannot change a warm-restart decision nor crash a rank; the
store listens only on the address the ranks use; the secret is private and the same for every rank."""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing
import os
import queue
import socket
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as tdist

from slurmkit import trust
from slurmkit.common.cause import Cause
from slurmkit.supervisor.decision import Action, Decision
from slurmkit.worker.process_group import Dist, DistEnv, Group
from slurmkit.worker.signed_store import tcp_store
from slurmkit.worker.train import warm

TIMEOUT = dt.timedelta(seconds=60)
SECRET = b"s" * 32
FORGED = {"decision": {"restart": True, "live_step": 3},
          "rank1": {"rank": 1, "error": "forged", "peer_failed": False, "live_step": 3}}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _foreign(port: int) -> Any:
    """Another user's client: it knows the port, not the secret."""
    return tdist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT, wait_for_workers=False)


def test_a_value_not_written_with_the_secret_is_never_read() -> None:
    port = _free_port()
    store = tcp_store("127.0.0.1", port, 1, True, TIMEOUT, SECRET)
    foreign = _foreign(port)
    key = "slurmkit/warm/0/decision"
    foreign.set(key, json.dumps(FORGED["decision"]))
    assert warm._read(store, key, warm.parse_verdict) is None
    foreign.set(key, b"\xff" * 40)  # garbage, as long as a tag: neither a crash nor a value
    assert warm._read(store, key, warm.parse_verdict) is None
    store.set(key, json.dumps({"restart": False, "live_step": None}))
    assert warm._read(store, key, warm.parse_verdict) == warm.Verdict(False, None)
    assert key in foreign.list_keys()  # it can see and copy what the ranks wrote...
    foreign.set("slurmkit/warm/1/decision", foreign.get(key))
    assert warm._read(store, "slurmkit/warm/1/decision", warm.parse_verdict) is None  # ...not replay it elsewhere
    store.set(key, json.dumps({"restart": "yes"}))  # signed but malformed: not a decision
    assert warm._read(store, key, warm.parse_verdict) is None


def test_a_rendezvous_value_planted_ahead_is_waited_past_not_read() -> None:
    port = _free_port()
    store = tcp_store("127.0.0.1", port, 1, True, TIMEOUT, SECRET)
    foreign = _foreign(port)
    key = "slurmkit/gen1/0/rank_1"  # a key of the next generation's gloo rendezvous, planted ahead
    foreign.set(key, "10.9.9.9:1234")
    writer = tcp_store("127.0.0.1", port, 1, False, TIMEOUT, SECRET)  # the rank that owns the key, later
    threading.Timer(0.5, lambda: writer.set(key, "127.0.0.1:5555")).start()
    assert store.get(key) == b"127.0.0.1:5555"


def test_the_store_listens_only_on_the_ranks_address() -> None:
    port = _free_port()
    store = tcp_store("127.0.0.2", port, 1, True, TIMEOUT, SECRET)  # kept: the server lives with it
    assert store.num_keys() >= 0
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    with socket.create_connection(("127.0.0.2", port), timeout=5):
        pass


def _rank(rank: int, port: int, restart: bool, out: Any) -> None:
    torch.set_num_threads(1)
    denv = DistEnv(rank, 2, rank, 2, "127.0.0.1", port, "1", "local")
    group = Group(denv, "gloo", torch.device("cpu"), TIMEOUT, secret=SECRET)
    group.store.inner.wait(["planted"])  # the foreign client has planted its values
    dist = Dist(denv, "gloo", "cpu", group)
    mine = warm.Report(rank, "RuntimeError: boom", peer_failed=rank == 1, live_step=7)
    yes = Decision(Action.RESTART_WARM, Cause.CRASH, 7)
    decision = warm.agree(dist, mine, lambda reports, live: yes if restart else None, 10.0,
                          lambda: None, lambda: False)
    group.store.set(f"read{rank}", "1")
    if rank == 0:  # rank 0's process hosts the store: it stays until rank 1 has read the decision
        group.store.wait(["read1"])
    out.put((rank, decision.restart, decision.live_step))


@pytest.mark.parametrize("restart", [False, True])
def test_a_foreign_process_that_knows_the_port_cannot_change_a_decision(restart: bool) -> None:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    ranks = [ctx.Process(target=_rank, args=(r, port, restart, out)) for r in (0, 1)]
    for p in ranks:
        p.start()
    foreign = _foreign(port)
    forged = {"restart": not restart, "live_step": 3}
    foreign.set("slurmkit/warm/0/decision", json.dumps(forged))
    foreign.set("slurmkit/warm/0/rank1", json.dumps(FORGED["rank1"]))
    foreign.set("planted", "1")
    results = sorted(_results(out, ranks))
    for p in ranks:
        p.join(60)
    assert [p.exitcode for p in ranks] == [0, 0]  # no rank crashed
    assert results == [(0, restart, 7 if restart else None), (1, restart, 7 if restart else None)]


def _results(out: Any, ranks: list[Any]) -> list[tuple[int, bool, int | None]]:
    """Each rank's result as it comes; a rank that dies first fails the test at once, with its exit
    code (a bare wait on the queue would only say it was empty, as one CI run under load did)."""
    got: list[tuple[int, bool, int | None]] = []
    for _ in range(120):  # 10 minutes, for a machine under load; a hang fails, not hangs the suite
        if len(got) == len(ranks):
            break
        try:
            got.append(out.get(timeout=5))
        except queue.Empty:
            crashed = [(r, p.exitcode) for r, p in enumerate(ranks) if p.exitcode not in (None, 0)]
            assert not crashed, f"rank(s) died before they answered: {crashed}"
    assert len(got) == len(ranks), f"only {got} answered"
    return got


def test_the_run_secret_is_private_made_once_and_the_same_for_every_reader(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    os.chmod(run_dir, 0o2750)  # a group run: members read logs, never the secret
    first = trust.run_secret(run_dir)
    assert len(first) == trust.SECRET_BYTES and trust.run_secret(run_dir) == first
    assert stat.S_IMODE((run_dir / trust.SECRET_FILE).stat().st_mode) == 0o600
    assert [p.name for p in run_dir.iterdir()] == [trust.SECRET_FILE]  # no temp file left


def test_a_host_name_that_resolves_to_loopback_on_its_own_node_listens_everywhere(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmkit.worker import signed_store

    names = {"node1": "127.0.1.1", "node2": "10.0.0.12"}  # node1's own /etc/hosts maps it to loopback
    real = socket.gethostbyname
    monkeypatch.setattr(signed_store.socket, "gethostbyname", lambda name: names.get(name) or real(name))
    assert signed_store.bind_address("node1") == ""  # node2 must reach it: every interface, the signatures guard
    assert signed_store.bind_address("node2") == "10.0.0.12"
    assert signed_store.bind_address("127.0.0.1") == "127.0.0.1"
    assert signed_store.bind_address("localhost") == "127.0.0.1"
