"""Profiles: shipped ones load, extends and search order work, bad input is one precise line."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurmkit.errors import ConfigError
from slurmkit.load.loader import available_profiles, load_profile, resolve
from tests.conftest import write_spec

SHIPPED = ["local", "devcluster", "gpu-pyxis", "hpc-apptainer", "cpu-partition"]


def test_every_shipped_profile_validates() -> None:
    names = available_profiles()
    for name in SHIPPED:
        assert name in names
        profile = load_profile(name)
        assert profile.description


def test_local_is_the_embedded_default_and_needs_no_slurm(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, name="x", command="true")
    res = resolve(spec)
    assert res.profile_name == "local"
    assert res.profile.executor == "local"


def test_extends_merges_nested_fields() -> None:
    cpu = load_profile("cpu-partition")
    dev = load_profile("devcluster")
    assert cpu.partition == "cpu" and dev.partition == "debug"
    assert cpu.signal == dev.signal  # inherited
    assert cpu.setup.env["OMP_NUM_THREADS"] == "8"  # child wins inside a nested mapping


def test_profile_path_env_comes_before_shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "devcluster.yaml").write_text("executor: slurm\npartition: mine\n")
    monkeypatch.setenv("SLURMKIT_PROFILE_PATH", str(tmp_path))
    assert load_profile("devcluster").partition == "mine"
    explicit = tmp_path / "other.yaml"
    explicit.write_text("partition: explicit\n")
    assert load_profile(str(explicit)).partition == "explicit"


def test_extends_cycle_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("extends: ./b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: ./a.yaml\n")
    with pytest.raises(ConfigError, match="extends itself"):
        load_profile(str(tmp_path / "a.yaml"))


@pytest.mark.parametrize(
    ("body", "field", "fragment"),
    [
        ("partiton: gpu\n", "partiton", "did you mean 'partition'"),
        ("resources:\n  nods: 2\n", "resources.nods", "did you mean 'nodes'"),
        ("resources:\n  time: soon\n", "resources.time", "HH:MM:SS"),
        ("resources:\n  nodes: 0\n", "resources.nodes", "greater than or equal to 1"),
        ("executor: kubernetes\n", "executor", "'slurm' or 'local'"),
        ("sbatch_extra: ['-x y']\n", "sbatch_extra", "--key=value"),
        ("container:\n  runtime: pyxis\n  image: i\n  mounts: ['/a']\n", "container",
         "valid: /SRC:/DST or /SRC:/DST:ro|rw"),
        ("partition: \"a\\nb\"\n", "partition", "control characters"),
        ("setup:\n  env:\n    BAD-NAME: x\n", "setup.env", "[A-Za-z_]"),
    ],
)
def test_bad_profile_is_one_line_with_file_field_and_valid(tmp_path: Path, body: str, field: str,
                                                           fragment: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError) as info:
        load_profile(str(path))
    msg = info.value.one_line()
    assert f"{path.resolve()}:{field}" in msg
    assert fragment in msg
    assert "\n" not in msg


def test_error_names_the_parent_file_when_the_parent_is_wrong(tmp_path: Path) -> None:
    (tmp_path / "parent.yaml").write_text("qos: [1, 2]\n")
    (tmp_path / "child.yaml").write_text("extends: ./parent.yaml\npartition: p\n")
    with pytest.raises(ConfigError) as info:
        load_profile(str(tmp_path / "child.yaml"))
    assert f"{(tmp_path / 'parent.yaml').resolve()}:qos" in str(info.value)


def test_unknown_profile_lists_valid_names() -> None:
    with pytest.raises(ConfigError) as info:
        load_profile("devclustr")
    assert "did you mean 'devcluster'" in str(info.value)
    assert "local" in str(info.value)


def test_invalid_yaml_reports_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("partition: gpu\nresources: [\n")
    with pytest.raises(ConfigError, match=r"broken.yaml:\d+: invalid YAML"):
        load_profile(str(path))


def test_precedence_set_over_spec_over_profile_over_defaults(tmp_path: Path) -> None:
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump({"extends": "devcluster", "resources": {"nodes": 2, "cpus_per_task": 2}}))
    spec = write_spec(tmp_path, name="x", command="true", resources={"nodes": 3})
    res = resolve(spec, str(prof), ["resources.nodes=4", "profile.partition=other"])
    assert res.resources.nodes == 4  # --set beats spec
    assert res.profile.partition == "other"  # --set profile.* beats the profile file
    res = resolve(spec, str(prof))
    assert res.resources.nodes == 3  # spec beats profile
    assert res.resources.cpus_per_task == 2  # profile beats defaults
    assert res.resources.gpus_per_node == 0  # defaults fill the rest


def test_set_values_are_typed(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, name="x", task="train")
    res = resolve(spec, "local", ["config.lr=1e-3", "config.steps=10", "config.model=gpt", "name=renamed"])
    assert res.spec.config == {"lr": 0.001, "steps": 10, "model": "gpt"}
    assert res.spec.name == "renamed"


@pytest.mark.parametrize(
    ("fields", "sets", "where", "fragment"),
    [
        ({"name": "x"}, [], "spec.yaml", "exactly one of command, callable, function, task, ray is needed, got none"),
        ({"name": "x", "command": "a", "task": "train"}, [], "spec.yaml", "got command, task"),
        ({"name": "bad name", "command": "a"}, [], "spec.yaml:name", "letters, digits"),
        ({"name": "x", "command": "a"}, ["resurces.nodes=2"], "--set:resurces", "did you mean 'resources'"),
        ({"name": "x", "callable": "nocolon"}, [], "spec.yaml:callable", "module.path:function"),
        ({"name": "x", "task": "dance"}, [], "spec.yaml:task", "valid: train"),
        ({"name": "x", "task": "train"}, ["config.stepz=1"], "--set:config.stepz", "did you mean 'steps'"),
        ({"name": "x", "task": "train", "config": {"model": "resnet"}}, [], "spec.yaml:config.model",
         "'digits' or 'gpt'"),
        ({"name": "x", "task": "train", "config": {"d_model": 30}}, [], "spec.yaml:config",
         "not a multiple of n_head"),
    ],
)
def test_bad_runspec(tmp_path: Path, fields: dict[str, Any], sets: list[str], where: str,
                     fragment: str) -> None:
    spec = write_spec(tmp_path, **fields)
    with pytest.raises(ConfigError) as info:
        resolve(spec, "local", sets)
    assert where in str(info.value)
    assert fragment in str(info.value)


def test_malformed_set_is_refused(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, name="x", command="true")
    with pytest.raises(ConfigError, match="--set: malformed override 'nodes'"):
        resolve(spec, "local", ["nodes"])


def test_a_relative_extends_is_read_beside_the_child_not_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / "base.yaml").write_text("extends: devcluster\npartition: beside\n")
    (folder / "child.yaml").write_text("extends: base.yaml\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "base.yaml").write_text("extends: devcluster\npartition: cwd\n")
    monkeypatch.chdir(elsewhere)
    assert load_profile(str(folder / "child.yaml")).partition == "beside"


def test_the_default_profile_where_slurm_is_here_says_so_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A login node (sbatch on PATH, Debian's real one as the dev cluster installs it) and no profile
    named: one warning line, since the ranks would start on the login node; none where one is named."""
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        pytest.skip("SKIPPED: no sbatch on PATH (scripts/test.sh installs Slurm; run as root)")
    spec = write_spec(tmp_path, name="here", command="true")
    monkeypatch.delenv("SLURMKIT_PROFILE", raising=False)
    warned = []
    for profile, path in ((None, f"{Path(sbatch).parent}:/bin"), ("local", os.environ["PATH"]),
                          (None, "/nonexistent")):
        monkeypatch.setenv("PATH", path)
        assert resolve(spec, profile).profile_name == "local"
        warned.append(capsys.readouterr().err.count("warning: "))
    assert warned == [1, 0, 0]
    monkeypatch.setenv("SLURMKIT_PROFILE", "local")
    monkeypatch.setenv("PATH", f"{Path(sbatch).parent}:/bin")
    resolve(spec)
    assert capsys.readouterr().err == ""


def test_every_shipped_profile_renders_without_user_in_the_environment(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """cron, `env -i` and many containers set no $USER: a profile's $USER is the caller's own name then."""
    import pwd

    from slurmkit.common.layout import expand_root
    from slurmkit.load.loader import available_profiles, resolve
    from slurmkit.runs import jobs

    monkeypatch.delenv("USER", raising=False)
    monkeypatch.delenv("LOGNAME", raising=False)
    me = pwd.getpwuid(os.getuid()).pw_name
    shipped = sorted(available_profiles())
    assert "gpu-pyxis" in shipped
    for name in shipped:
        script = jobs.dry_run(resolve({"name": "x", "command": "true"}, name, [])).script
        assert script.startswith("#!/bin/bash"), name
    assert expand_root("/lustre/scratch/$USER/runs") == Path(f"/lustre/scratch/{me}/runs")
