"""The Python API without a cluster: validation, pre-flight pickling, by-value modules, the local
profile end to end (submit, map_array, as_completed, from_id), and Checkpoint's agreed stop."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import slurmkit
from slurmkit.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def add(a: int, b: int) -> int:
    return a + b


def fails() -> None:
    raise ValueError("boom-4711")


def test_unknown_keyword_lists_what_is_valid(local_profile: Path) -> None:
    with pytest.raises(ConfigError) as err:
        slurmkit.Executor(profile=str(local_profile), node=2)
    line = str(err.value)
    assert "unknown keyword argument 'node'" in line and "did you mean 'nodes'" in line
    assert "valid: nodes, spare_nodes, elastic, tasks_per_node" in line and "partition" in line and "\n" not in line


@pytest.mark.parametrize(("kw", "where"), [
    ({"nodes": 0}, "Executor:resources.nodes"),
    ({"time": "forever"}, "Executor:resources.time"),
    ({"signal_delay_s": -1}, "Executor:signal_delay_s"),
    ({"name": "bad name!"}, "Executor:name"),
    ({"set": ["profile.executor=pbs"]}, "set:executor"),
])
def test_bad_values_are_one_line_with_where(local_profile: Path, kw: dict[str, Any], where: str) -> None:
    with pytest.raises(ConfigError) as err:
        slurmkit.Executor(profile=str(local_profile), **kw)
    assert str(err.value).startswith(where), str(err.value)


def test_render_is_the_dry_run_of_a_submit(dev_profile: Path, run_root: Path) -> None:
    ex = slurmkit.Executor(profile=str(dev_profile), nodes=2, tasks_per_node=1, time="00:05:00", partition="debug",
                           env={"FOO": "a b"}, set=["resources.cpus_per_task=1"])
    script = ex.render(add)
    assert "#SBATCH --nodes=2" in script and "#SBATCH --job-name=add" in script
    assert "export FOO='a b'" in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert list(run_root.iterdir()) == []  # a dry run creates nothing
    # update() returns a new executor; the old one is unchanged.
    assert "#SBATCH --nodes=1" in ex.update(nodes=1).render(add) and "#SBATCH --nodes=2" in ex.render(add)


def test_unpicklable_call_is_refused_at_submit(local_profile: Path, run_root: Path) -> None:
    ex = slurmkit.Executor(profile=str(local_profile))
    lock = threading.Lock()
    with pytest.raises(ConfigError) as err:
        ex.submit(lambda: lock.acquire())
    assert "do not pickle" in str(err.value) and "lock" in str(err.value).lower()

    def gen() -> Iterator[int]:
        yield 1

    with pytest.raises(ConfigError, match="returns a generator"):
        ex.submit(gen)
    with pytest.raises(ConfigError, match="not callable"):
        ex.submit(42)
    assert list(run_root.iterdir()) == []  # refused before anything was created


def test_spec_file_cannot_name_a_function(tmp_path: Path, local_profile: Path) -> None:
    from slurmkit.load.loader import resolve
    from slurmkit.runs import jobs

    resolved = resolve({"name": "x", "function": "m.f"}, str(local_profile))
    with pytest.raises(ConfigError, match="function is set only by slurmkit.Executor.submit"):
        jobs.submit(resolved)


def test_module_only_in_the_working_directory_goes_by_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module importable only from the login node's folder is pickled by value: the pickle
    loads in a process that cannot import it."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "loginonly_mod.py").write_text("FACTOR = 7\n\ndef times(x):\n    return FACTOR * x\n")
    monkeypatch.syspath_prepend(str(src))
    import loginonly_mod

    from slurmkit.api.executor import check_call
    from slurmkit.runs.jobs import Call

    call = Call(loginonly_mod.times, (6,))
    check_call(call)
    import cloudpickle

    blob = tmp_path / "call.pkl"
    blob.write_bytes(cloudpickle.dumps(call))
    code = f"import pickle; c = pickle.load(open({str(blob)!r}, 'rb')); print(c.fn(*c.args))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "42"
    # An installed package stays by reference: its function pickles as a name.
    import yaml

    assert len(cloudpickle.dumps(yaml.safe_dump)) < 100


def test_local_submit_result_failure_map_and_reattach(local_profile: Path, run_root: Path) -> None:
    ex = slurmkit.Executor(profile=str(local_profile), tasks_per_node=1, name="api")
    job = ex.submit(add, 2, b=3)
    lam = ex.submit(lambda x: x * 10, 4)
    bad = ex.submit(fails)
    assert job.result(timeout=120) == 5 and lam.result(timeout=120) == 40
    assert job.done() and job.state == "COMPLETED"
    with pytest.raises(slurmkit.JobFailedError) as err:
        bad.result(timeout=120)
    assert "boom-4711" in err.value.log_tail and "ValueError" in err.value.log_tail
    # A Job is small and picklable; Job.from_id in a fresh process reattaches (run id or prefix).
    assert pickle.loads(pickle.dumps(job)) == job and len(pickle.dumps(job)) < 400
    # A prefix no other run shares: runs submitted in the same second differ only in a random suffix.
    prefix = next(job.run_id[:n] for n in range(len(job.run_id) - 2, len(job.run_id) + 1)
                  if not any(r.startswith(job.run_id[:n]) for r in (lam.run_id, bad.run_id)))
    code = (f"import slurmkit; j = slurmkit.Job.from_id({prefix!r}, profile={str(local_profile)!r}); "
            "print(j.result())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "5"
    mapped = ex.map_array(add, [1, 2, 3], [10, 20, 30], max_parallel=2)
    done = list(slurmkit.as_completed(mapped, timeout=300))
    assert sorted(j.run_id for j in done) == sorted(j.run_id for j in mapped)
    assert [j.result() for j in mapped] == [11, 22, 33]
    # What Python submitted, the CLI sees: one run per submit, the map as one sweep.
    from slurmkit.runs import jobs
    from slurmkit.runs.folders import list_sweeps

    assert {s.run_id for s in jobs.status(str(run_root))} == {job.run_id, lam.run_id, bad.run_id}
    assert len(list_sweeps(str(run_root))) == 1


@pytest.fixture
def own_signals() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_checkpoint_stops_at_the_step_of_the_signal_and_resumes_there(
        tmp_path: Path, own_signals: None, single_process: None) -> None:
    import torch

    from slurmkit.worker.checkpoint import AgreedStop, Checkpoint

    uri = f"file://{tmp_path}/ckpt"

    def body(ckpt: Checkpoint, steps: int, signal_at: int | None) -> tuple[list[int], torch.Tensor]:
        state = ckpt.restore() or {"step": 0, "w": torch.zeros(3)}
        ran = []
        for step in range(state["step"], steps):
            w = state["w"] + step
            state = {"step": step + 1, "w": w}
            ran.append(step + 1)
            if step + 1 == signal_at:
                os.kill(os.getpid(), signal.SIGUSR2)  # the handler only sets the flag
            ckpt.step(step + 1, state, rank_state={"seen": torch.tensor([step + 1])})
        ckpt.close()
        return ran, state["w"]

    first = Checkpoint(uri, every=4)
    with pytest.raises(AgreedStop) as stop:
        body(first, 20, signal_at=7)
    assert stop.value.step == 7 and stop.value.requeue
    assert first.store.committed()[0] == 7 and first.store.is_valid(7) and first.store.is_valid(4)
    again = Checkpoint(uri, every=4)
    ran, w = body(again, 20, signal_at=None)
    assert again.rank_state is not None and again.rank_state["seen"].item() == 7  # this rank's own part
    assert ran == list(range(8, 21))  # nothing lost, nothing recomputed
    assert torch.equal(w, torch.full((3,), float(sum(range(20)))))


def test_a_function_checkpoint_that_verifies_but_does_not_load_falls_back_to_the_older_step(
        tmp_path: Path, own_signals: None, single_process: None) -> None:
    """slurmkit.Checkpoint restores through the Trainer's Checkpointer: a step whose files verify
    but do not load (weights_only refuses it) is skipped for the next older valid one."""
    import io
    import pickle

    import torch

    from slurmkit.worker.checkpoint import STATE_FILE, Checkpoint
    from slurmkit.worker.checkpoint.store import Entry

    uri = f"file://{tmp_path}/ckpt"
    ckpt = Checkpoint(uri, every=4)
    for step in range(1, 9):
        ckpt.step(step, {"step": step, "w": torch.full((2,), float(step))})
    ckpt.close()
    assert ckpt.store.committed() == [8, 4]
    buf = io.BytesIO()
    pickle.dump(Path("/etc"), buf)  # whole and hashed, but not tensors: weights_only refuses it
    evil = ckpt.store.write(8, STATE_FILE, buf.getvalue())
    ckpt.store.commit(8, [Entry(evil.name, evil.digest, evil.bytes)])
    assert ckpt.store.latest_valid() == 8
    again = Checkpoint(uri, every=4)
    state = again.restore()
    assert again.resumed_step == 4 and state is not None and state["step"] == 4
    assert torch.equal(state["w"], torch.full((2,), 4.0))


def test_import_slurmkit_api_is_torch_free() -> None:
    code = ("import sys, slurmkit; slurmkit.Executor; slurmkit.Job; slurmkit.as_completed; slurmkit.sweep; "
            "slurmkit.Checkpoint; slurmkit.distributed; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy'))))")
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_sweep_from_a_mapping_with_a_grid(local_profile: Path) -> None:
    sw = slurmkit.sweep({"name": "pysweep", "command": "echo v=$V", "env": {"V": "0"}}, profile=str(local_profile),
                        grid={"env.V": ["1", "2"]}, max_parallel=1)
    assert sw.wait(timeout=300) == {0: "COMPLETED", 1: "COMPLETED"}
    rows = sw.results()
    assert [(r["index"], r["env.V"], r["returncode"]) for r in rows] == [(0, "1", 0), (1, "2", 0)]
    assert sw.resubmit(failed=True) == []  # nothing failed, nothing resubmitted
    with pytest.raises(ConfigError, match="no sweep section"):
        slurmkit.sweep({"name": "x", "command": "true"}, profile=str(local_profile))


def test_local_map_array_with_a_snapshot_records_it_in_every_task(local_profile: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "helper.py").write_text("VERSION = 1\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    monkeypatch.chdir(repo)
    ex = slurmkit.Executor(profile=str(local_profile), tasks_per_node=1, snapshot=True)
    handles = ex.map_array(add, [1, 2], [3, 4])
    assert [j.result(timeout=300) for j in handles] == [4, 6]
    from slurmkit.common.record import RunFile

    for job in handles:
        snap = RunFile(job.paths).read().snapshot
        assert snap is not None
        assert snap["source"] == str(repo) and snap["files"] == 1 and snap["git_commit"] is None
    assert (Path(handles[0].run_dir).parent.parent / "code" / "helper.py").read_text() == "VERSION = 1\n"


def test_only_slurmkit_checkpoint_annotations_get_one() -> None:
    from slurmkit.worker.checkpoint import wants_checkpoint

    class OwnCheckpoint:
        pass

    def by_string(steps: int, ckpt: slurmkit.Checkpoint) -> None: ...
    def theirs(ckpt: OwnCheckpoint) -> None: ...

    unresolvable: dict[str, Any] = {}  # a module where the name was imported inside a function
    exec(compile("def f(steps, c: 'Checkpoint'): pass", "<m>", "exec", dont_inherit=True), unresolvable)
    assert wants_checkpoint(by_string) == "ckpt" and wants_checkpoint(unresolvable["f"]) == "c"
    assert wants_checkpoint(theirs) is None and wants_checkpoint(len) is None


class Checkpoint:  # a user's own class that happens to share the name
    pass


def shadowed(ckpt: Checkpoint) -> None: ...


def test_a_users_own_checkpoint_class_is_not_taken_for_slurmkits() -> None:
    from slurmkit.worker.checkpoint import wants_checkpoint

    assert wants_checkpoint(shadowed) is None


def test_a_checkpoint_says_when_a_stop_was_asked_for_a_loop_that_waits_on_something_else(tmp_path: Path) -> None:
    """stop_requested: False, then True once the profile's signal came (examples/rl_loop.py's trainer
    stops waiting for a rollout that is stopping too, and reaches its step's agreed stop)."""
    code = ("import os, signal, sys; from slurmkit.worker.checkpoint import Checkpoint; "
            "c = Checkpoint(sys.argv[1]); print(c.stop_requested); os.kill(os.getpid(), signal.SIGUSR2); "
            "print(c.stop_requested)")
    out = subprocess.run([sys.executable, "-P", "-c", code, f"file://{tmp_path}/ckpt"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "SLURMKIT_SIGNAL": "USR2"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]
