"""Sweeps at scale without a cluster: factored validation equals full validation, the manifest
stays compact and is written once, old manifests still read, arrays split exactly at the limit."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from slurmkit.common import sweep_layout
from slurmkit.common.locked import CorruptRecordError
from slurmkit.errors import ConfigError
from slurmkit.sweeps import plan as plan_mod
from slurmkit.sweeps import resolve, spec
from slurmkit.sweeps import submit as sub
from tests.unit.test_sweeps import write_sweep

TRAIN = {"task": "train", "config": {"model": "gpt", "steps": 10}}


def both(path: Path, profile: Path, sets: list[str] | None = None) -> tuple[Any, Any]:
    """(factored, full) resolutions of one sweep: each a SweepTasks, or the ConfigError it raised."""
    out: list[resolve.SweepTasks | ConfigError] = []
    for factor in (True, False):
        try:
            out.append(resolve.resolve_tasks(spec.load(path), str(profile), sets, factor=factor))
        except ConfigError as exc:
            out.append(exc)
    return out[0], out[1]


def specs_of(tasks: resolve.SweepTasks, plan: spec.SweepPlan) -> list[dict[str, Any]]:
    manifest = sweep_layout.SweepManifest(
        sweep_id="s", name="s", base_spec=tasks.base_spec, top=tasks.top,
        tasks=[sweep_layout.ManifestTask(index=i, overrides=o, seed=0, spec=s)
               for i, (o, s) in enumerate(zip(plan.overrides, tasks.specs, strict=True))])
    return [sweep_layout.task_spec(manifest, i) for i in range(len(tasks))]


def same_result(path: Path, profile: Path, sets: list[str] | None = None) -> str:
    """Resolve both ways, assert they agree; which way the factored resolution went: factored,
    full (it fell back) or error (both refused the sweep, with the same one-line error)."""
    fast, full = both(path, profile, sets)
    if isinstance(full, ConfigError):
        assert isinstance(fast, ConfigError) and str(fast) == str(full)
        return "error"
    assert isinstance(fast, resolve.SweepTasks), fast
    plan = spec.load(path)
    assert fast.seeds == full.seeds and fast.group_of == full.group_of
    assert specs_of(fast, plan) == specs_of(full, plan)
    assert fast.groups[0].spec == full.groups[0].spec  # the array script renders from the first task
    return "factored" if fast.base_spec is not None else "full"


def test_factored_validation_equals_full_validation_on_random_sweeps(tmp_path: Path, local_profile: Path) -> None:
    rng = random.Random(5)
    pools: dict[str, list[Any]] = {  # invalid ones: "fast", True, 0 steps, a newline; n_head=3 with 128
        "config.lr": [1e-3, 3e-3, 0.1, "fast"], "config.n_head": [3, 2, 4], "config.d_model": [96, 192, 128],
        "config.seed": [0, 1, True], "config.steps": [5, 10, 0], "env.X": ["a", 1, 2.5, "x\ny"]}
    seen: dict[str, int] = {"factored": 0, "full": 0, "error": 0}
    for _ in range(120):
        keys = rng.sample(sorted(pools), rng.randint(1, 3))
        grid = {k: rng.sample(pools[k], rng.randint(1, 2)) for k in keys}
        seen[same_result(write_sweep(tmp_path, {"grid": grid}, command=None, **TRAIN), local_profile)] += 1
    assert all(n >= 3 for n in seen.values()), seen  # every way was drawn, not only the easy one


@pytest.mark.parametrize(("grid", "sets", "way"), [
    ({"config.lr": [1e-3, 3e-3], "config.seed": [0, 1], "env.X": ["a", "b"]}, None, "factored"),
    ({"config.lr": [1e-3, 3e-3]}, ["config.lr=0.5"], "factored"),  # --set beats the sweep
    ({"config.n_head": [3], "config.d_model": [96]}, None, "full"),  # n_head=3 is valid only with d_model=96
    ({"config.n_head": [3, 4], "config.d_model": [96]}, None, "full"),  # 96 takes both; 128 (the base) not 3
    ({"config.n_head": [3, 5], "config.d_model": [96]}, None, "error"),  # 96 % 5 != 0
    ({"config.n_head": [4, 3], "config.d_model": [128]}, None, "error"),  # 128 % 3 != 0
    ({"resources.nodes": [1, 2], "config.lr": [0.1]}, None, "full"),
])
def test_each_way_of_resolving(tmp_path: Path, local_profile: Path, grid: dict[str, list[Any]],
                               sets: list[str] | None, way: str) -> None:
    path = write_sweep(tmp_path, {"grid": grid}, command=None, **TRAIN)
    assert same_result(path, local_profile, sets) == way


def test_a_combination_error_names_the_sweep(tmp_path: Path, local_profile: Path) -> None:
    path = write_sweep(tmp_path, {"grid": {"config.lr": [0.1, 0.2], "config.n_head": [4, 5]}}, command=None, **TRAIN)
    with pytest.raises(ConfigError, match="d_model=128 is not a multiple of n_head=5") as err:
        resolve.resolve_tasks(spec.load(path), str(local_profile))
    assert err.value.where == f"{path}:sweep:config"  # what validating that one task in full says


def test_manifest_is_compact_and_written_once(tmp_path: Path, local_profile: Path) -> None:
    plan = spec.load(write_sweep(tmp_path, {"grid": {"env.A": list(range(100)), "env.B": list(range(100))}}))
    paths = sub.create(plan, resolve.resolve_tasks(plan, str(local_profile)))
    text = paths.manifest.read_text()
    assert len(text) / 10_000 < 120, f"{len(text) / 10_000:.0f} bytes per task"
    manifest = sweep_layout.Manifest(paths).read()
    assert len(manifest.tasks) == 10_000 and manifest.arrays == []
    last = sweep_layout.task_entry(paths, manifest, 9_999)
    assert last.spec["env"] == {"A": "99", "B": "99"} and last.env["SLURMKIT_SEED"] == "9999"
    assert last.run_dir == str(paths.task(9_999).run_dir)
    with pytest.raises(TypeError, match="written once"):
        sweep_layout.Manifest(paths).update(name="x")
    with sweep_layout.ArrayLog(paths).editing() as log:
        log.arrays.append(sweep_layout.ArrayEntry(indices=[0], base=0, job_id="7", kind="initial"))
    assert paths.manifest.read_text() == text  # recording an array leaves the manifest alone
    assert sweep_layout.latest_job_ids(sweep_layout.Manifest(paths).read())[0] == "7_0"


def test_a_manifest_of_the_wrong_shape_is_one_error_naming_its_field(tmp_path: Path, local_profile: Path) -> None:
    plan = spec.load(write_sweep(tmp_path, {"grid": {"env.A": ["1", "2"]}}))
    paths = sub.create(plan, resolve.resolve_tasks(plan, str(local_profile)))
    data = json.loads(paths.manifest.read_text())
    data["tasks"][1]["seed"] = "seven"
    paths.manifest.write_text(json.dumps(data))
    with pytest.raises(CorruptRecordError) as err:
        sweep_layout.Manifest(paths).read()
    assert err.value.where == f"{paths.manifest}:tasks"


@pytest.mark.parametrize(("tasks", "limit", "expected"), [
    (1001, 1001, [(0, "0-1000")]),  # exactly MaxArraySize: one array
    (1002, 1001, [(0, "0-1000"), (1001, "0")]),  # one more: a second array, task ids from 0 again
    (8, 4, [(0, "0-3%2"), (4, "0-3%2")]),
])
def test_arrays_split_exactly_at_the_limit(tasks: int, limit: int, expected: list[tuple[int, str]]) -> None:
    arrays = plan_mod.plan_arrays([0] * tasks, list(range(tasks)), limit, 2 if tasks == 8 else None)
    assert [(a["base"], a["array"]) for a in arrays] == expected
    assert sorted(i for a in arrays for i in a["indices"]) == list(range(tasks))  # none dropped, none twice


def test_interleaved_resource_groups_each_get_their_own_arrays() -> None:
    group_of = [i % 3 for i in range(10)]
    arrays = plan_mod.plan_arrays(group_of, list(range(10)), 4, None)
    # Chunks start at multiples of the limit (4), so an array task id is the index minus its base.
    assert [(a["group"], a["base"], a["indices"], a["array"]) for a in arrays] == [
        (0, 0, [0, 3], "0,3"), (0, 4, [6], "2"), (0, 8, [9], "1"),
        (1, 0, [1], "1"), (1, 4, [4, 7], "0,3"),
        (2, 0, [2], "2"), (2, 4, [5], "1"), (2, 8, [8], "0")]
    assert all(group_of[i] == a["group"] for a in arrays for i in a["indices"])


@pytest.mark.parametrize("rows", [[], [{"index": 0, "state": "PENDING"}], [{"a": [1, {"b": "x\ny"}]}, {"c": None}]])
def test_streamed_json_is_what_one_dump_prints(rows: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> None:
    from slurmkit.cli.common import print_json, print_json_list

    print_json(rows)
    whole = capsys.readouterr().out
    print_json_list(iter(rows))
    assert capsys.readouterr().out == whole
