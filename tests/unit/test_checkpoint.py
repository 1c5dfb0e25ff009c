"""CheckpointStore and AsyncWriter on real filesystems (file://, plain paths) and memory://."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from slurmkit.worker.checkpoint import crc as record_crc
from slurmkit.worker.checkpoint.store import MARKER, TRAINER_FILES, CheckpointError, CheckpointStore
from slurmkit.worker.checkpoint.threads import AsyncWriter, Prefetch, cpu_copy


def _uris(tmp_path: Path) -> list[str]:
    return [str(tmp_path / "plain"), f"file://{tmp_path / 'url'}", f"memory://ck-{uuid.uuid4().hex}"]


def _save(store: CheckpointStore, step: int, value: float) -> None:
    w = AsyncWriter(store)
    w.start(step, {"model.pt": {"w": torch.full((4,), value)}, "rank0.pt": {"step": step}})
    store.commit(step, w.result())


@pytest.mark.parametrize("kind", [0, 1, 2], ids=["plain-path", "file-url", "memory"])
def test_commit_then_load_latest(tmp_path: Path, kind: int) -> None:
    store = CheckpointStore(_uris(tmp_path)[kind])
    assert store.latest_valid() is None
    _save(store, 10, 1.0)
    _save(store, 20, 2.0)
    assert store.latest_valid() == 20
    assert torch.equal(store.load(20, "model.pt")["w"], torch.full((4,), 2.0))
    manifest = store.verify(20)
    assert manifest is not None and set(manifest["files"]) == {"model.pt", "rank0.pt"}


@pytest.mark.parametrize("kind", [0, 2], ids=["plain-path", "memory"])
def test_uncommitted_and_corrupt_checkpoints_are_skipped(tmp_path: Path, kind: int) -> None:
    store = CheckpointStore(_uris(tmp_path)[kind])
    _save(store, 10, 1.0)
    _save(store, 20, 2.0)
    store.write(30, "model.pt", b"half a checkpoint, no marker")
    assert store.latest_valid() == 20
    store.fs.pipe_file(f"{store.step_dir(20)}/model.pt", b"bit rot")
    logged: list[str] = []
    assert store.latest_valid(logged.append) == 10
    assert any("step-20" in m for m in logged)


@pytest.mark.parametrize("kind", [0, 2], ids=["plain-path", "memory"])
def test_prefetch_verifies_in_the_background_and_keeps_only_the_chosen_bytes(tmp_path: Path, kind: int) -> None:
    store = CheckpointStore(_uris(tmp_path)[kind])
    assert Prefetch(store).result() == (None, {})
    _save(store, 10, 1.0)
    _save(store, 20, 2.0)
    store.fs.pipe_file(f"{store.step_dir(20)}/model.pt", b"bit rot")
    prefetch = Prefetch(store)
    step, data = prefetch.result()
    assert step == 10 and set(data) == {"model.pt", "rank0.pt"}
    assert any("step-20" in m for m in prefetch.messages)
    # The kept bytes are step-10's files, verified: loading them equals loading from storage.
    assert torch.equal(store.load(10, "model.pt", data["model.pt"])["w"], store.load(10, "model.pt")["w"])


def test_keep_latest_k_prunes_only_after_a_newer_commit(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "ck"))
    for step in (1, 2, 3):
        _save(store, step, float(step))
        store.prune(2)
    assert store.steps() == [3, 2]
    store.write(4, "model.pt", b"in flight")  # not committed: must not cause a prune
    assert store.prune(2) == [] and store.committed() == [3, 2]


def test_local_writes_leave_no_temp_files(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "ck"))
    _save(store, 5, 5.0)
    assert sorted(os.listdir(tmp_path / "ck" / "step-5")) == [MARKER, "model.pt", "rank0.pt"]


def test_weights_only_load_refuses_arbitrary_objects(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "ck"))
    import io
    import pickle

    buf = io.BytesIO()
    pickle.dump(Path("/etc"), buf)  # an object weights_only must not reconstruct
    entry = store.write(1, "evil.pt", buf.getvalue())
    store.commit(1, [entry])
    with pytest.raises(Exception, match="(?i)weights_only|unsupported|not allowed"):
        store.load(1, "evil.pt")


def test_background_failure_is_raised_and_older_checkpoints_stay(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    store = CheckpointStore(str(root))
    _save(store, 1, 1.0)
    os.chmod(root, 0o500)  # a permission error on the next step folder
    try:
        if os.geteuid() == 0:
            # root ignores permissions: make the step folder a file instead, an equally real failure
            os.chmod(root, 0o755)
            (root / "step-2").write_text("not a folder")
        w = AsyncWriter(store)
        w.start(2, {"model.pt": {"w": torch.zeros(2)}})
        with pytest.raises(CheckpointError, match="checkpoint step 2: cannot write model.pt"):
            w.result()
    finally:
        os.chmod(root, 0o755)
    assert store.latest_valid() == 1


def test_at_most_one_save_in_flight(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "ck"))
    w = AsyncWriter(store)
    w.start(1, {"a.pt": {"x": torch.zeros(1000)}})
    w.start(2, {"a.pt": {"x": torch.ones(1000)}})  # waits for the first before starting
    assert w.step == 2 and [e.name for e in w.result()] == ["a.pt"]


def test_cpu_copy_is_a_copy() -> None:
    live: dict[str, Any] = {"w": torch.zeros(3), "nested": [torch.ones(2)]}
    snap = cpu_copy(live)
    live["w"] += 5
    live["nested"][0] += 5
    assert torch.equal(snap["w"], torch.zeros(3)) and torch.equal(snap["nested"][0], torch.ones(2))


KILLER = """
import sys, torch
from slurmkit.worker.checkpoint.threads import AsyncWriter
from slurmkit.worker.checkpoint.store import CheckpointStore
store = CheckpointStore(sys.argv[1])
step = int(sys.argv[2])
w = AsyncWriter(store)
w.start(step, {"model.pt": {"w": torch.randn(2_000_000)}, "optim.pt": {"m": torch.randn(2_000_000)}})
store.commit(step, w.result())
print("committed", flush=True)
"""


def test_sigkill_during_saves_never_leaves_an_accepted_broken_checkpoint(tmp_path: Path) -> None:
    import random
    import time

    root = tmp_path / "ck"
    rng = random.Random(0)
    committed, killed_mid_write = 0, 0
    for step in range(1, 25):
        proc = subprocess.Popen([sys.executable, "-c", KILLER, str(root), str(step)], stdout=subprocess.PIPE)
        if step % 2:  # kill once this step's files are being written, a random moment later
            while not (root / f"step-{step}").exists() and proc.poll() is None:
                time.sleep(0.005)
            time.sleep(rng.uniform(0, 0.05))
            proc.kill()
        out, _ = proc.communicate()
        committed += b"committed" in out
        killed_mid_write += (root / f"step-{step}").exists() and not (root / f"step-{step}" / MARKER).exists()
        if step >= 6 and committed and killed_mid_write:
            break
    assert committed >= 1 and killed_mid_write >= 1, (committed, killed_mid_write)  # both events happened
    store = CheckpointStore(str(root))
    for step in store.committed():
        assert store.verify(step) is not None, f"step-{step} has a marker but does not verify"
    latest = store.latest_valid()
    assert latest is not None  # a commit happened, and commits verify
    assert store.load(latest, "model.pt")["w"].numel() == 2_000_000


def test_prune_counts_only_checkpoints_that_verify(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "ck"))
    for step in (20, 30):  # committed, then corrupted: a restart found none valid and began at 0
        _save(store, step, float(step))
        (tmp_path / "ck" / f"step-{step}" / "model.pt").write_bytes(b"bit rot")
    fresh = CheckpointStore(str(tmp_path / "ck"))
    _save(fresh, 10, 10.0)
    assert fresh.prune(2) == []  # one valid checkpoint is fewer than 2: nothing goes
    assert fresh.latest_valid() == 10
    _save(fresh, 11, 11.0)
    assert fresh.prune(2) == [] and fresh.latest_valid() == 11
    assert fresh.steps() == [30, 20, 11, 10]  # the corrupt newer ones did not count toward the two kept


def test_prune_keeps_protected_steps(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "ck"))
    for step in (1, 2, 3, 4):
        _save(store, step, float(step))
    assert store.prune(2, protect=(4, 1)) == [2]
    assert store.steps() == [4, 3, 1]


def test_a_manifest_without_a_required_file_is_not_valid(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "ck"), required=TRAINER_FILES)
    store.commit(5, [store.write(5, "model.pt", b"weights only")])
    assert store.manifest(5) is None and store.latest_valid() is None
    store.commit(6, [store.write(6, name, b"x") for name in TRAINER_FILES])
    assert store.latest_valid() == 6


def test_the_checksum_catches_a_changed_byte_and_sha256_manifests_still_verify(tmp_path: Path) -> None:
    """xxh3-128 in new manifests; a manifest written with sha256 (before 2026-12-04) still verifies."""
    import hashlib
    import json

    store = CheckpointStore(str(tmp_path / "ck"), ("a.bin",))
    data = os.urandom(1 << 20)
    entry = store.write(1, "a.bin", data)
    store.commit(1, [entry])
    assert json.loads((tmp_path / "ck/step-1" / MARKER).read_text())["files"]["a.bin"] == {
        "xxh3_128": entry.digest, "bytes": len(data)}
    legacy = {"step": 2, "files": {"a.bin": {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}}}
    store.write(2, "a.bin", data)
    store.write(2, MARKER, json.dumps(legacy).encode())
    fresh = CheckpointStore(str(tmp_path / "ck"), ("a.bin",))
    assert fresh.verify(1) is not None and fresh.verify(2) is not None
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 1
    for step in (1, 2):
        (tmp_path / f"ck/step-{step}/a.bin").write_bytes(bytes(flipped))
    fresh = CheckpointStore(str(tmp_path / "ck"), ("a.bin",))
    assert fresh.verify(1) is None and fresh.verify(2) is None and fresh.latest_valid() is None


def test_a_checkpoint_thread_still_running_at_exit_finishes_before_the_interpreters_finalization(
        tmp_path: Path) -> None:
    """A script's process exits while one of slurmkit's checkpoint threads is still at work: the
    exit handler (slurmkit.worker.at_exit) joins it while the interpreter is whole, where Python
    would have killed the daemon thread in its finalization (torch, there, can abort the process)."""
    done = tmp_path / "done"
    script = ("import threading, time\nfrom slurmkit.worker import at_exit\n"
              "started = threading.Event()\n"
              f"def work():\n    started.set()\n    time.sleep(0.5)\n    open({str(done)!r}, 'w').close()\n"
              "at_exit.daemon(work, 'slurmkit-ckpt-test')\nstarted.wait()\n")
    proc = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert done.exists()  # written after the main thread had ended: the handler waited for it


def _record_crcs(path: Path) -> list[int]:
    """The CRC-32 each data record of a torch.save'd file carries in its zip entry."""
    with zipfile.ZipFile(path) as z:
        return [i.CRC for i in z.infolist() if "/data/" in i.filename]


def test_checkpoint_records_carry_no_crc_and_the_scripts_own_saves_keep_theirs(tmp_path: Path) -> None:
    """slurmkit's checksum in the stream covers a checkpoint's every byte: torch.save's CRC-32 of each
    record is off while a checkpoint is written (record_crc), and torch.save is as it was after."""
    store = CheckpointStore(str(tmp_path / "ck"))
    _save(store, 1, 3.0)
    assert _record_crcs(Path(store.step_dir(1)) / "model.pt") == [0]
    assert torch.equal(store.load(1, "model.pt")["w"], torch.full((4,), 3.0))
    torch.save({"w": torch.full((4,), 3.0)}, tmp_path / "own.pt")
    assert _record_crcs(tmp_path / "own.pt") != [0]


def test_overlapping_checkpoint_writes_share_one_crc_switch() -> None:
    """Two writes in flight (the writer thread's and a stop's): the CRC comes back with the last."""
    assert torch.serialization.get_crc32_options()
    first, second = record_crc.off(), record_crc.off()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not torch.serialization.get_crc32_options()  # the second write is still out
    second.__exit__(None, None, None)
    assert torch.serialization.get_crc32_options()


def test_the_storage_seam_is_what_every_store_here_opens(tmp_path: Path) -> None:
    """CheckpointStore reads and writes only through Storage's names; each URI kind the tests use
    (a folder, file://, memory://) opens a storage that has all of them."""
    from slurmkit.worker.checkpoint.storage import Storage, open_storage

    names = [n for n in Storage.__dict__ if not n.startswith("_")] + list(Storage.__annotations__)
    assert {"ls", "cat_file", "pipe_file", "protocol"} <= set(names)  # the check sees the Protocol's members
    for uri in _uris(tmp_path):
        fs, root = open_storage(uri)
        assert root and all(hasattr(fs, n) for n in names), uri
        assert CheckpointStore(uri).fs is not None
    with pytest.raises(CheckpointError):
        open_storage("nosuchprotocol://x")
