"""Checkpoints on an object store, proven against a real S3 server (moto's, tests/s3_server.py):
the marker last, a kill between a save's files leaves no committed step, the agreed stop and the
restore over s3://, `bench fs` and `doctor` on s3:// with their baseline, and one line for what is
missing (no credentials, no bucket, no s3fs in the ranks' python) (issue 33, item 4)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from slurmkit.cli.app import app
from slurmkit.errors import PreflightError
from slurmkit.load.loader import resolve
from slurmkit.slurm.imports import check_storage
from slurmkit.worker.checkpoint.store import MARKER, CheckpointError, CheckpointStore, to_bytes
from tests.conftest import write_spec
from tests.s3_server import BUCKET, S3

ROOT = Path(__file__).resolve().parents[2]


def test_a_step_on_s3_counts_only_once_its_marker_is_written(s3_server: S3) -> None:
    import torch

    uri = f"s3://{BUCKET}/marker/ckpt"
    store = CheckpointStore(uri, ("state.pt",))
    store.commit(5, [store.write(5, "state.pt", to_bytes({"w": torch.arange(4.0)}))])
    store.write(10, "state.pt", to_bytes({"w": torch.zeros(4)}))  # written, never committed
    fresh = CheckpointStore(uri, ("state.pt",))
    assert fresh.steps() == [10, 5] and fresh.committed() == [5] and fresh.latest_valid() == 5
    assert torch.equal(fresh.load(5, "state.pt")["w"], torch.arange(4.0))
    s3_server.fs().pipe_file(f"{BUCKET}/marker/ckpt/step-5/state.pt", b"torn")  # the bytes change after commit
    assert CheckpointStore(uri, ("state.pt",)).latest_valid() is None  # its checksum no longer matches


KILLED_SAVE = """
import os, signal, sys, torch
from slurmkit.worker.checkpoint.threads import AsyncWriter
from slurmkit.worker.checkpoint.store import CheckpointStore
store = CheckpointStore(sys.argv[1], ("a.pt", "b.pt"))
first = AsyncWriter(store)
first.start(5, {"a.pt": torch.ones(2), "b.pt": torch.ones(2)})
store.commit(5, first.result())
def killed(step, name):  # the writer thread, after each file: die once step 10's first file is up
    if step == 10:
        os.kill(os.getpid(), signal.SIGKILL)
second = AsyncWriter(store, killed)
second.start(10, {"a.pt": torch.full((1 << 20,), 2.0), "b.pt": torch.full((1 << 20,), 2.0)})
second.result()
"""


def test_a_kill_during_a_save_to_s3_leaves_no_committed_step(s3_server: S3) -> None:
    uri = f"s3://{BUCKET}/killed/ckpt"
    proc = subprocess.run([sys.executable, "-c", KILLED_SAVE, uri], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    store = CheckpointStore(uri, ("a.pt", "b.pt"))
    assert 10 in store.steps()  # the kill came mid-save: a file of step 10 is there...
    assert not s3_server.fs().exists(f"{BUCKET}/killed/ckpt/step-10/{MARKER}")  # ...and no marker
    assert store.latest_valid() == 5


KILLED_UPLOAD = """
import os, signal, sys, torch
from slurmkit.worker.checkpoint import store as ckptstore
store = ckptstore.CheckpointStore(sys.argv[1])
store.commit(5, [store.write_obj(5, "a.pt", torch.ones(2))])
write = ckptstore.HashingStream.write
def dying(self, data):  # die inside the upload, once more than two parts have gone out
    n = write(self, data)
    if self.size > 2 * ckptstore.UPLOAD_PART + (1 << 20):
        os.kill(os.getpid(), signal.SIGKILL)
    return n
ckptstore.HashingStream.write = dying
store.write_obj(10, "a.pt", torch.zeros(5 * ckptstore.UPLOAD_PART // 4))
"""


def test_a_kill_inside_one_files_upload_leaves_no_object_and_no_committed_step(s3_server: S3) -> None:
    uri = f"s3://{BUCKET}/killed-upload/ckpt"
    proc = subprocess.run([sys.executable, "-c", KILLED_UPLOAD, uri], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    fs = s3_server.fs()
    uploads = fs.list_multipart_uploads(BUCKET)
    # The file was going out in parts (a multipart upload begun, never completed) and is not an object.
    assert any(u["Key"] == "killed-upload/ckpt/step-10/a.pt" for u in uploads), uploads
    assert not fs.exists(f"{BUCKET}/killed-upload/ckpt/step-10/a.pt")
    assert CheckpointStore(uri).latest_valid() == 5


STREAMED = """
import json, sys, tracemalloc, torch
from slurmkit.worker.checkpoint.store import UPLOAD_PART, CheckpointStore
store = CheckpointStore(sys.argv[1])
tensor = torch.arange(2 * UPLOAD_PART, dtype=torch.float32)  # 8 parts' worth (128 MiB)
tracemalloc.start()
entry = store.write_obj(1, "w.pt", tensor)
peak = tracemalloc.get_traced_memory()[1]
store.commit(1, [entry])
print(json.dumps({"peak": peak, "bytes": entry.bytes, "tensor": tensor.numel() * 4}))
"""


def test_a_file_streamed_to_s3_is_never_whole_in_memory_a_second_time(s3_server: S3) -> None:
    """In a process of its own (the S3 server keeps what it receives in this one's memory)."""
    import torch

    uri = f"s3://{BUCKET}/streamed/ckpt"
    proc = subprocess.run([sys.executable, "-c", STREAMED, uri], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    # The Python-side buffers (the part being filled, its upload: about 3 parts, 51 MB measured) stay
    # far below the file's size; whole, as bytes and in the client's buffer, it was 3 times the file.
    assert out["bytes"] > out["tensor"] and out["peak"] < out["tensor"] // 2, out
    store = CheckpointStore(uri)
    assert store.verify(1) is not None and torch.equal(store.load(1, "w.pt"), torch.arange(out["tensor"] // 4.0))


def test_the_agreed_stop_saves_to_s3_and_the_restore_goes_on_bitwise(s3_server: S3, single_process: None) -> None:
    import torch

    from slurmkit.worker.checkpoint import AgreedStop, Checkpoint

    uri = f"s3://{BUCKET}/agreed/ckpt"
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM)}

    def train(ckpt: Checkpoint, stop_at: int | None) -> torch.Tensor:
        state = ckpt.restore() or {"step": 0, "w": torch.zeros(3, dtype=torch.float64)}
        w = state["w"]
        for step in range(state["step"], 30):
            w = w * 1.01 + step
            if step + 1 == stop_at:
                os.kill(os.getpid(), signal.SIGUSR2)
            ckpt.step(step + 1, {"step": step + 1, "w": w})
        ckpt.close()
        return w

    try:
        with pytest.raises(AgreedStop) as stop:
            train(Checkpoint(uri, every=4), stop_at=13)
        assert stop.value.step == 13
        resumed = Checkpoint(uri, every=4)
        w = train(resumed, stop_at=None)
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    assert resumed.resumed_step == 13
    assert torch.equal(w, train(Checkpoint(f"s3://{BUCKET}/agreed/reference", every=0), stop_at=None))


def test_bench_fs_on_s3_measures_against_the_clients_own_upload(s3_server: S3) -> None:
    result = CliRunner().invoke(app, ["bench", "fs", f"s3://{BUCKET}/bench", "--size", "4MiB", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["bytes"] == 4 << 20 and out["write_vs_put"] > 0 and out["put_write_MBps"] > 0
    assert not s3_server.fs().exists(f"{BUCKET}/bench")  # it cleans up after itself


@pytest.mark.parametrize("what", ["no credentials", "no bucket", "no endpoint"])
def test_what_is_missing_for_s3_is_one_line(s3_server: S3, tmp_path: Path, what: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(ROOT))  # no ~/.aws of the caller's
    uri = f"s3://{BUCKET}/x"
    if what != "no credentials":
        env.update(s3_server.env)
    if what == "no bucket":
        uri = "s3://no-such-bucket/x"
    if what == "no endpoint":
        env["AWS_ENDPOINT_URL"] = "http://127.0.0.1:9"  # discard: nothing listens
    profile = tmp_path / "s3.yaml"
    profile.write_text(yaml.safe_dump({"extends": "local", "checkpoint_root": uri, "run_root": str(tmp_path)}))
    for argv in (["bench", "fs", uri, "--size", "1MiB"], ["doctor", "-p", str(profile), "--json"]):
        proc = subprocess.run([sys.executable, "-m", "slurmkit", *argv], capture_output=True, text=True, timeout=300,
                              env=env, cwd=tmp_path)
        assert "Traceback" not in proc.stderr + proc.stdout
        if argv[0] == "bench":
            assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
        else:
            (row,) = [c for c in json.loads(proc.stdout) if c["name"] == "checkpoint_root"]
            assert row["status"] == "FAIL"
    assert not s3_server.fs().exists("no-such-bucket")  # never created on the way


def test_submit_asks_the_ranks_python_for_s3fs_and_the_bucket(s3_server: S3, tmp_path: Path, dev_profile: Path,
                                                              bare_python: Path) -> None:
    spec = write_spec(tmp_path, name="s3", command="true")
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump({"extends": str(dev_profile), "python": str(bare_python),
                                    "checkpoint_root": f"s3://{BUCKET}/runs"}))
    with pytest.raises(PreflightError) as err:
        check_storage(resolve(spec, str(bare)))
    assert err.value.where == "profile:checkpoint_root"
    check_storage(resolve(spec, str(dev_profile), [f"profile.checkpoint_root=s3://{BUCKET}/runs"]))  # s3fs, bucket
    with pytest.raises(PreflightError):
        check_storage(resolve(spec, str(dev_profile), ["profile.checkpoint_root=s3://no-such-bucket/runs"]))


def test_an_unreachable_store_is_refused_when_opened(s3_server: S3) -> None:
    with pytest.raises(CheckpointError):
        CheckpointStore("s3://no-such-bucket/x")
