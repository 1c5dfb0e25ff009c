"""Property test: a hostile string in ANY string field of the profile or run spec is either refused
with one line naming that field, or rendered into a script that passes bash -n and shellcheck and
whose every #SBATCH line is exactly one option. test_cluster_sbatch_parser.py then asks sbatch's
own parser, on the dev cluster, for a sample.
"""

from __future__ import annotations

import shlex
import types
import typing
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from slurmkit.config.profile import ClusterProfile
from slurmkit.config.runspec import RunSpec
from slurmkit.errors import SlurmkitError
from slurmkit.load.loader import resolve
from slurmkit.render import RESERVED_WORDS
from tests.unit.test_quoting import HOSTILE, PRINTABLE
from tests.unit.test_render import check_shell, render_profile

# Not rendered as values: raw shell by contract (setup.commands), or looked up as files first.
# The container and ray blocks need their other fields to validate at all: tests/unit/test_containers.py
# and test_ray_spec.py render their values. The login block is never rendered: it reaches ssh's argv
# (tests/unit/test_remote.py), and its host and user are refused unless they are names.
NOT_VALUES = {"profile.setup.commands", "profile.extends", "profile.template_dir", "profile.container", "spec.ray",
              "profile.login"}


def _string_fields(model: type[BaseModel], prefix: str) -> list[tuple[str, str]]:
    """(dotted field, shape) for every field that holds text: str, list of str, or str-to-str map."""
    found: list[tuple[str, str]] = []
    for name, field in model.model_fields.items():
        path = f"{prefix}.{name}"
        if path in NOT_VALUES:
            continue
        ann = field.annotation
        union = typing.get_origin(ann) in (typing.Union, types.UnionType)
        args = [a for a in typing.get_args(ann) if a is not type(None)] if union else [ann]
        for arg in args:
            origin, inner = typing.get_origin(arg), typing.get_args(arg)
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                found += _string_fields(arg, path)
            elif _is_str(arg):
                found.append((path, "str"))
            elif origin is list and inner and _is_str(inner[0]):
                found.append((path, "list"))
            elif origin is dict and inner and _is_str(inner[1]):
                found.append((path, "map"))
    return found


def _is_str(ann: Any) -> bool:
    return ann is str or (typing.get_origin(ann) is typing.Annotated and typing.get_args(ann)[0] is str)


FIELDS = _string_fields(ClusterProfile, "profile") + _string_fields(RunSpec, "spec")
printable = st.text(PRINTABLE, max_size=30)
hostile = st.one_of(st.sampled_from(HOSTILE), printable, st.text(max_size=12))


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[last] = value


def test_the_property_covers_the_fields_that_reach_the_script() -> None:
    names = {f for f, _ in FIELDS}
    assert {"profile.partition", "profile.account", "profile.run_root", "profile.sbatch_extra", "profile.setup.env",
            "profile.setup.modules", "profile.setup.venv", "profile.nccl_env", "profile.python",
            "profile.resources.mem", "profile.resources.time", "spec.name", "spec.env"} <= names


def test_a_hostile_value_in_any_string_field(tmp_path: Path) -> None:
    seen: Counter[str] = Counter()

    @settings(max_examples=150, deadline=None)
    @given(field=st.sampled_from(FIELDS), value=hostile, key=st.sampled_from(["HOSTILE", "ON", "1X", "A B"]))
    def check(field: tuple[str, str], value: str, key: str) -> None:
        seen[_one_example(tmp_path, field, value, key)] += 1

    check()
    assert seen["refused"] > 0 and seen["rendered"] > 0, seen  # both branches were really taken


@pytest.mark.parametrize("word", sorted(RESERVED_WORDS))
def test_a_shell_keyword_as_a_value_renders_as_a_word(tmp_path: Path, word: str) -> None:
    """Found by the test above: `module load then` is bash, but shellcheck read the keyword (SC1010)."""
    assert _one_example(tmp_path, ("profile.setup.modules", "list"), word, "K") == "rendered"


def _one_example(tmp_path: Path, field: tuple[str, str], value: str, key: str) -> str:
    dotted, shape = field
    shaped: Any = {"str": value, "list": [value], "map": {key: value}}[shape]
    prof: dict[str, Any] = {"extends": "devcluster", "run_root": str(tmp_path / "runs")}
    spec: dict[str, Any] = {"name": "q", "command": "true"}
    _set(prof if dotted.startswith("profile.") else spec, dotted.split(".", 1)[1], shaped)
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(prof))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    try:
        resolve(tmp_path / "s.yaml", str(tmp_path / "p.yaml"))
        script = render_profile(tmp_path / "s.yaml", str(tmp_path / "p.yaml"))
    except SlurmkitError as exc:
        line = exc.one_line()
        assert "\n" not in line and len(line) < 400, line
        assert exc.where and exc.where.endswith(tuple(_where_suffixes(dotted))), (dotted, line)
        return "refused"
    check_shell(script, tmp_path)
    for line in script.split("\n"):
        if line.startswith("#SBATCH "):
            words = shlex.split(line[len("#SBATCH "):])
            assert len(words) == 1 and words[0].startswith("--"), line  # one option, nothing injected
    return "rendered"


def _where_suffixes(dotted: str) -> list[str]:
    """Where an error about `dotted` may point: the field, an item of it, or the whole file (model checks)."""
    field = dotted.split(".", 1)[1]
    return [f":{field}", ".yaml", f":{field}.0", *(f":{field}.{k}" for k in ("HOSTILE", "ON", "1X", "A B", "True"))]
