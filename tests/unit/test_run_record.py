"""run.json's spec, profile and resources are typed (RunSpec, ClusterProfile, Resources), and a
run.json another slurmkit version wrote still reads: what this version cannot read is kept aside
in `unread`, never lost through a rewrite."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slurmkit.common.cause import Cause
from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RunFile, RunRecord
from slurmkit.config.profile import ClusterProfile, Resources
from slurmkit.config.runspec import RunSpec
from slurmkit.load.loader import resolve

# What an older slurmkit wrote: a spec key since removed, a profile key and a nested budget it no
# longer has, and values it now refuses (a node count past Slurm's int, a '#' sbatch reads as a comment).
OLDER: dict[str, Any] = {
    "run_id": "old-20250101-000000-abcd", "name": "old", "executor": "slurm", "job_ids": ["41"],
    "spec": {"name": "old", "command": "echo hi", "retries": 2, "resources": {"nodes": 2}},
    "profile": {"partition": "debug", "gpu_check": True, "requeue": {"preemption": 4, "oom": 1},
                "resources": {"nodes": 99_999_999_999}, "account": "proj#1"},
    "resources": {"nodes": 2, "tasks_per_node": 1, "time": "00:10:00"},
    "restarts": [{"kind": "requeue", "n": 1, "job_id": "41", "cause": "preemption", "time": "t"}],
}


def write(tmp_path: Path, data: dict[str, Any]) -> RunFile:
    paths = RunPaths(tmp_path / str(data["run_id"]))
    paths.run_dir.mkdir(mode=0o700)
    paths.record.write_text(json.dumps(data))
    paths.record.chmod(0o600)
    return RunFile(paths)


def test_an_older_run_json_reads_typed_and_keeps_what_it_cannot_read(tmp_path: Path) -> None:
    file = write(tmp_path, OLDER)
    record = file.read()
    assert isinstance(record.spec, RunSpec) and record.spec.command == "echo hi" and record.spec.resources.nodes == 2
    assert isinstance(record.profile, ClusterProfile) and record.profile.partition == "debug"
    assert record.profile.account is None and record.profile.resources.nodes is None  # refused: defaults apply
    assert isinstance(record.resources, Resources) and record.resources.time == "00:10:00"
    assert record.budget(Cause.PREEMPTION) == 4 and record.left(Cause.PREEMPTION) == 3
    assert record.unread == {"spec": {"retries": 2},
                             "profile": {"gpu_check": True, "requeue": {"oom": 1}, "account": "proj#1",
                                         "resources": {"nodes": 99_999_999_999}}}
    # A rewrite by this version (a restart recorded, say) keeps what it could not read.
    file.update(final="budget spent")
    again = json.loads(file.path.read_text())
    assert again["unread"] == record.unread and again["final"] == "budget spent"
    assert file.read().unread == record.unread


def test_a_spec_of_a_kind_this_version_does_not_know_reads_as_none_and_is_kept(tmp_path: Path) -> None:
    newer = {**OLDER, "run_id": "new-20270101-000000-abcd", "spec": {"name": "new", "notebook": "a.ipynb"}}
    record = write(tmp_path, newer).read()
    assert record.spec is None and record.unread is not None
    assert record.unread["spec"] == {"name": "new", "notebook": "a.ipynb"}
    assert record.tracking() is None and record.job_ids == ["41"]


def test_a_record_this_version_wrote_reads_back_equal_and_without_unread(tmp_path: Path) -> None:
    resolved = resolve({"name": "now", "command": "echo $X", "env": {"X": "1"},
                        "tracking": {"tensorboard": True}}, "local")
    paths = RunPaths(tmp_path / "now-20261206-000000-abcd")
    record = RunRecord(run_id=paths.run_id, name="now", spec=resolved.spec.model_dump(),
                       profile=resolved.profile.model_dump(), resources=resolved.resources.model_dump())
    assert RunFile(paths).create(record)
    back = RunFile(paths).read()
    assert back == record and back.unread is None
    assert back.spec == resolved.spec and back.profile == resolved.profile and back.resources == resolved.resources
    assert back.tracking() is not None and back.tracking() == resolved.spec.tracking
