"""Bad input is one clear line (what, where, what is valid), exit 2, no traceback, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner, Result

from slurmkit.cli.app import app
from tests.conftest import write_spec

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")


def refused(argv: list[str]) -> Result:
    """Run the CLI; assert the one-line refusal and return it."""
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    assert len(lines[0]) < 400, lines[0]
    return result


def profile(tmp_path: Path, name: str = "p.yaml", **fields: object) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"extends": "local", "run_root": str(tmp_path / "runs"), **fields}))
    return path


def nothing_under(root: Path) -> bool:
    return not root.exists() or not any(root.iterdir())


def test_binary_spec_file(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(b"\xff\xfe\x00\x01binary")
    assert "spec.yaml: not UTF-8 text (byte 0xff at offset 0)" in refused(["render", str(spec)]).stderr


def test_a_script_where_a_spec_goes_is_told_how_a_spec_runs_it(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\nprint('hi')\n")
    for argv in (["render", str(script)], ["submit", str(script)]):
        result = refused(argv)
        assert result.exit_code == 2 and "command: python train.py" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_a_batch_that_does_not_split_over_the_ranks_is_refused_at_render(tmp_path: Path) -> None:
    """It used to pass render and submit and fail on the compute node, after the queue wait."""
    spec = write_spec(tmp_path, name="x", task="train", config={"model": "digits", "batch_size": 9},
                      resources={"tasks_per_node": 2})
    result = refused(["render", str(spec), "-p", str(profile(tmp_path))])
    assert "spec.yaml:config.batch_size" in result.stderr


def test_binary_profile_file(tmp_path: Path) -> None:
    prof = tmp_path / "bin.yaml"
    prof.write_bytes(b"partition: \x80\x81\n")
    spec = write_spec(tmp_path, name="x", command="true")
    assert "bin.yaml: not UTF-8 text" in refused(["render", str(spec), "-p", str(prof)]).stderr


def test_deeply_nested_yaml(tmp_path: Path) -> None:
    spec = tmp_path / "deep.yaml"
    spec.write_text('name: x\ncallable: "m:f"\nkwargs:\n  a: ' + "[" * 3000 + "]" * 3000 + "\n")
    assert "deep.yaml: nested too deeply" in refused(["render", str(spec)]).stderr
    spec.write_text('name: x\ncallable: "m:f"\nkwargs:\n  a: ' + "[" * 60 + "]" * 60 + "\n")
    assert "deep.yaml: nested deeper than 40 levels" in refused(["render", str(spec)]).stderr


def test_a_1500_deep_extends_chain(tmp_path: Path) -> None:
    for i in range(1500):
        (tmp_path / f"p{i}.yaml").write_text(f"extends: {tmp_path / f'p{i + 1}.yaml'}\n")
    (tmp_path / "p1500.yaml").write_text("extends: local\n")
    spec = write_spec(tmp_path, name="x", command="true")
    err = refused(["render", str(spec), "-p", str(tmp_path / "p0.yaml")]).stderr
    assert "extends chain longer than 32 profiles" in err and ":extends" in err


def test_extends_pointing_at_a_non_yaml_file(tmp_path: Path) -> None:
    prof = tmp_path / "child.yaml"
    prof.write_text(f"extends: {sys.executable}\n")
    spec = write_spec(tmp_path, name="x", command="true")
    err = refused(["render", str(spec), "-p", str(prof)]).stderr
    assert f"{prof.resolve()}:extends: extends names" in err and "not a .yaml file" in err


def test_extends_to_a_missing_profile_names_the_file_that_extends(tmp_path: Path) -> None:
    prof = tmp_path / "child.yaml"
    prof.write_text("extends: no-such-profile\n")
    spec = write_spec(tmp_path, name="x", command="true")
    err = refused(["render", str(spec), "-p", str(prof)]).stderr
    assert f"{prof.resolve()}:extends: unknown profile 'no-such-profile'" in err and "valid: " in err


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path: Path) -> None:
    lines = ['name: x', 'callable: "m:f"', "kwargs:", '  a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefghi", "bcdefghij", strict=True):
        lines.append(f"  {name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    spec = tmp_path / "bomb.yaml"
    spec.write_text("\n".join(lines) + "\n")
    assert "bomb.yaml: expands to more than 200000 values" in refused(["render", str(spec)]).stderr


def test_run_root_not_a_directory_leaves_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("in the way")
    spec = write_spec(tmp_path, name="x", command="true")
    err = refused(["submit", str(spec), "-p", str(profile(tmp_path, run_root=str(blocker / "runs")))]).stderr
    assert "profile:run_root=" in err and "cannot create the run root" in err
    assert blocker.read_text() == "in the way"


def test_run_root_a_dangling_symlink_does_not_spin(tmp_path: Path) -> None:
    link = tmp_path / "runs"
    link.symlink_to(tmp_path / "gone")
    spec = write_spec(tmp_path, name="x", command="true")
    err = refused(["submit", str(spec), "-p", str(profile(tmp_path))]).stderr
    assert "cannot create the run root: a dangling symlink" in err


def test_run_root_unwritable_even_for_root(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, name="x", command="true")
    err = refused(["submit", str(spec), "-p", str(profile(tmp_path, run_root="/proc/slurmkit-runs"))]).stderr
    assert "profile:run_root='/proc/slurmkit-runs'" in err


@needs_root
def test_a_full_run_root_leaves_no_empty_run_folder(tmp_path: Path) -> None:
    full = tmp_path / "full"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], check=True)
    try:
        (full / "runs").mkdir()
        fd = os.open(full / "filler", os.O_WRONLY | os.O_CREAT)
        try:  # fill the disk to the last block
            while os.write(fd, b"\0" * 512):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        spec = write_spec(tmp_path, name="x", command="true")
        err = refused(["submit", str(spec), "-p", str(profile(tmp_path, run_root=str(full / "runs")))]).stderr
        assert "No space left on device" in err and "profile:run_root" in err
        assert nothing_under(full / "runs")
    finally:
        subprocess.run(["umount", str(full)], check=True)


def test_booleans_are_not_integers(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, name="x", command="true", resources={"nodes": True})
    err = refused(["render", str(spec)]).stderr
    assert "spec.yaml:resources.nodes: got the boolean true" in err
    err = refused(["render", str(spec), "--set", "resources.nodes=2", "--set", "resources.cpus_per_task=yes"]).stderr
    assert "--set:resources.cpus_per_task: got the boolean true" in err


def test_time_zero_means_no_limit_on_the_local_executor(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, name="x", command="echo still-here", resources={"time": "0"})
    result = CliRunner().invoke(app, ["submit", str(spec), "-p", str(profile(tmp_path)), "--wait"])
    assert result.exit_code == 0, result.output
    assert "COMPLETED" in result.stdout and "still-here" in result.stdout


def test_more_local_ranks_than_cpus_warns(tmp_path: Path) -> None:
    ranks = len(os.sched_getaffinity(0)) + 1
    spec = write_spec(tmp_path, name="x", command="true", resources={"tasks_per_node": ranks})
    result = CliRunner().invoke(app, ["submit", str(spec), "-p", str(profile(tmp_path)), "--wait"])
    assert result.exit_code == 0, result.output
    assert f"{ranks} local rank(s) asking {ranks} CPU(s) on {ranks - 1} CPU(s)" in result.stderr


def test_a_huge_value_is_cut_in_the_message(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, name="x" * 10_000, command="true")
    err = refused(["render", str(spec)]).stderr
    assert "spec.yaml:name: invalid name 'xxxx" in err and "(10002 chars)" in err
    spec = write_spec(tmp_path, name="x", command="true", resources={"time": "9" * 10_000 + "x"})
    assert "(10003 chars)" in refused(["render", str(spec)]).stderr
    assert "(10002 chars)" in refused(["render", str(spec), "--set", "y" * 10_000]).stderr


def test_set_null_is_blamed_on_set(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, name="x", command="true")
    err = refused(["render", str(spec), "--set", "name="]).stderr  # name is text: "null" would be a name
    assert "error: --set:name: " in err


def test_env_keys_read_as_booleans_say_what_happened(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text('name: x\ncommand: "true"\nenv:\n  ON: "1"\n  NO: "2"\n')
    err = refused(["render", str(spec)]).stderr
    assert "spec.yaml:env: key True is a bool, not a name: YAML reads unquoted ON/OFF" in err
    assert "quote it, e.g. 'ON'" in err
    spec.write_text('name: x\ncommand: "true"\nenv:\n  DEBUG: yes\n')
    assert "spec.yaml:env: DEBUG: got the boolean true" in refused(["render", str(spec)]).stderr
    spec.write_text('name: x\ncommand: "true"\nenv:\n  N: 4\n')
    result = CliRunner().invoke(app, ["render", str(spec)])
    assert result.exit_code == 0 and "export N=4" in result.stdout  # a number is its text


def test_an_alias_bomb_in_one_set_value_is_refused(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, name="x", callable="m:f")
    levels = ["&a [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for prev, name in zip("abcdefg", "bcdefgh", strict=True):
        levels.append(f"&{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    err = refused(["render", str(spec), "--set", "kwargs.x=[" + ", ".join(levels) + "]"]).stderr
    assert "error: --set: expands to more than 200000 values" in err


def test_launcher_torchrun_off_slurm_or_an_unknown_launcher_is_one_line(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, name="tr", command="true")
    out = refused(["submit", str(spec), "-p", str(profile(tmp_path)), "--set", "launcher=torchrun"])
    assert ":launcher:" in out.stderr and "valid: srun here" in out.stderr
    out = refused(["submit", str(spec), "-p", str(profile(tmp_path)), "--set", "launcher=mpirun"])
    assert "launcher" in out.stderr and "torchrun" in out.stderr
    assert nothing_under(tmp_path / "runs")


def test_spare_nodes_off_slurm_or_with_torchrun_or_a_negative_count_is_one_line(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, name="sp", command="true")
    out = refused(["submit", str(spec), "-p", str(profile(tmp_path)), "--set", "resources.spare_nodes=1"])
    assert ":resources.spare_nodes: spare_nodes on the local executor" in out.stderr
    slurm = profile(tmp_path, "s.yaml", extends="devcluster")
    out = refused(["render", str(spec), "-p", str(slurm), "--set", "resources.spare_nodes=1",
                   "--set", "launcher=torchrun"])
    assert "spare_nodes with launcher torchrun" in out.stderr and "valid: 0, or launcher srun" in out.stderr
    out = refused(["render", str(spec), "-p", str(slurm), "--set", "resources.spare_nodes=-1"])
    assert "--set:resources.spare_nodes: Input should be greater than or equal to 0" in out.stderr
    out = refused(["submit", str(spec), "-p", str(profile(tmp_path)), "--set", "resources.elastic=true"])
    assert ":resources.elastic: elastic on the local executor" in out.stderr and "valid: false here" in out.stderr
    out = refused(["render", str(spec), "-p", str(slurm), "--set", "resources.elastic=true",
                   "--set", "launcher=torchrun"])
    assert "elastic with launcher torchrun" in out.stderr
    assert nothing_under(tmp_path / "runs")


def test_report_to_a_path_it_cannot_write_is_one_line(tmp_path: Path) -> None:
    from tests.unit.test_tracking import run_folder

    (tmp_path / "runs").mkdir()
    paths = run_folder(tmp_path / "runs", {})
    (tmp_path / "d.html").mkdir()
    (tmp_path / "plain").write_text("a file, not a folder")
    for target in ("/proc/self/x.html", str(tmp_path / "d.html"), str(tmp_path / "plain" / "r.html")):
        refused(["report", str(paths.run_dir), "-o", target])
    assert (tmp_path / "d.html").is_dir() and not any((tmp_path / "d.html").iterdir())


@pytest.mark.parametrize("size", ["999999999999T", "9" * 400 + "T"])
def test_bench_fs_beyond_the_free_space_is_one_line(tmp_path: Path, size: str) -> None:
    refused(["bench", "fs", str(tmp_path), "--size", size])
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_bench_fs_memory_does_not_grow_with_the_size(tmp_path: Path) -> None:
    """The bench's data is written in parts: 256 MiB of it takes well under 256 MiB of memory."""
    probe = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, capture_output=True); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    done = subprocess.run([sys.executable, "-P", "-c", probe, sys.executable, "-P", "-m", "slurmkit", "bench", "fs",
                           str(tmp_path), "--size", "256MiB", "--json"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    peak_kib = int(done.stdout.split()[-1])
    assert peak_kib * 1024 < 256 * 2**20  # it held 2.6x the size before


def test_a_set_nested_past_the_yaml_limit_is_one_line(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, name="x", command="true")
    refused(["render", str(spec), "--set", ".".join(["a"] * 500) + "=1"])


def refused_at_line(tmp_path: Path, text: str) -> str:
    """The spec `text` refused by the CLI in one line; where its reader says the problem is."""
    from slurmkit.errors import ConfigError
    from slurmkit.load.yamlio import read_yaml

    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    refused(["render", str(spec)])
    with pytest.raises(ConfigError) as err:
        read_yaml(spec)
    return str(err.value.where).removeprefix(f"{spec}:")


def test_a_duplicate_yaml_key_is_refused_with_its_line(tmp_path: Path) -> None:
    from slurmkit.load.yamlio import read_yaml

    assert refused_at_line(tmp_path, "name: x\ncommand: true\nresources:\n  nodes: 2\nresources:\n  time: 10\n") == "5"
    merged = tmp_path / "merged.yaml"  # a merge key may still be overridden, as YAML means it
    merged.write_text("base: &b {nodes: 1, time: 5}\nresources:\n  <<: *b\n  nodes: 2\n")
    assert read_yaml(merged)["resources"] == {"nodes": 2, "time": 5}


def test_a_nul_byte_in_yaml_names_its_line(tmp_path: Path) -> None:
    assert refused_at_line(tmp_path, "name: x\ncommand: tr\x00ue\n") == "2"


def test_an_empty_run_id_names_no_run(tmp_path: Path) -> None:
    for argv in (["status", ""], ["logs", ""], ["cancel", ""]):
        refused([*argv, "-p", str(profile(tmp_path))])


@pytest.mark.skipif(os.geteuid() != 0, reason="a folder of another user needs root")
def test_a_cache_folder_another_user_made_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmkit.remote.connection import private_cache
    from slurmkit.trust import NotOwnError

    for planted in ("slurmkit/ssh", "slurmkit"):
        cache = tmp_path / planted.replace("/", "-")
        (cache / planted).mkdir(parents=True, mode=0o700)
        os.chown(cache / planted, 65534, 65534)  # nobody's
        monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
        with pytest.raises(NotOwnError):
            private_cache("ssh")


@pytest.mark.parametrize("field", [{"argv": "status"}, {"files": "yes"}, {"profile": [["a.yaml", 3]]},
                                   {"op": "shell"}, {"argv": [1, 2]}])
def test_a_request_with_a_wrong_typed_field_is_one_line(field: dict[str, object], capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    import base64
    import dataclasses
    import json

    from slurmkit.cli import serve_command
    from slurmkit.remote.request import Request

    data = dataclasses.asdict(Request("run", argv=["status"], profile=[("a.yaml", {})])) | field
    assert serve_command.main([base64.urlsafe_b64encode(json.dumps(data).encode()).decode()]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
