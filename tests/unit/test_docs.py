"""Docs stay true: the field reference matches the models, and documented examples run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from slurmkit.cli.app import app
from slurmkit.common import perms
from slurmkit.config.fields import SBATCH_FORBIDDEN
from slurmkit.config.profile import ClusterProfile
from slurmkit.config.reference import BEGIN, END, SECTIONS, reference
from slurmkit.config.reference import DOCS as REFERENCED
from tests.conftest import ROOT

DOCS = ROOT / "docs"


@pytest.mark.parametrize("doc", sorted(REFERENCED))
def test_field_references_are_generated_from_the_models(doc: str) -> None:
    text = (ROOT / doc).read_text()
    section = text[text.index(BEGIN): text.index(END) + len(END)]
    assert section == reference(REFERENCED[doc]), "run: python -m slurmkit.config.reference"


def test_every_profile_field_is_documented_in_the_model() -> None:
    for _, model in SECTIONS:
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no docstring"
    assert "partition" in ClusterProfile.model_fields


def test_profiles_doc_inheritance_example_validates(tmp_path: Path) -> None:
    text = (DOCS / "profiles.md").read_text()
    example = text.split("# ~/profiles/mylab.yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "mylab.yaml"
    path.write_text(example)
    result = CliRunner().invoke(app, ["profiles", "validate", str(path)])
    assert result.exit_code == 0, result.output


def test_remote_doc_profile_example_validates_with_its_login_host(tmp_path: Path) -> None:
    from slurmkit.load.loader import load_profile
    text = (ROOT / "docs/remote.md").read_text()
    path = tmp_path / "site.yaml"
    path.write_text(text.split("# site.yaml, in a folder on SLURMKIT_PROFILE_PATH\n", 1)[1].split("```", 1)[0])
    prof = load_profile(str(path))
    assert prof.login is not None and prof.login.destination == "alice@hpc.example.org"
    assert prof.run_root == "~/slurmkit-runs" and prof.partition == "gpu"


def test_templates_doc_override_example_renders(tmp_path: Path) -> None:
    text = (DOCS / "templates.md").read_text()
    example = text.split("{# my-templates/sbatch.sh.j2 #}\n", 1)[1].split("```", 1)[0]
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "sbatch.sh.j2").write_text(example)
    prof = tmp_path / "p.yaml"
    prof.write_text(f"extends: devcluster\ntemplate_dir: {tmp_path / 'tpl'}\n")
    result = CliRunner().invoke(app, ["render", str(ROOT / "tests/golden/spec.yaml"), "-p", str(prof)])
    assert result.exit_code == 0, result.output
    assert 'echo "running on $(hostname)"' in result.output


def test_sweeps_doc_example_expands_to_the_documented_24_tasks(tmp_path: Path) -> None:
    import json

    text = (DOCS / "sweeps.md").read_text()
    example = text.split("# lr-sweep.yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "lr-sweep.yaml"
    path.write_text(example)
    prof = tmp_path / "p.yaml"
    prof.write_text(f"extends: devcluster\nrun_root: {tmp_path / 'runs'}\n")
    result = CliRunner().invoke(app, ["sweep", str(path), "-p", str(prof), "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["tasks"] == 24 and info["arrays"] == [{"tasks": "0-23", "array": "0-23%4"}]
    assert info["varying"] == ["config.lr", "config.seed", "config.hidden", "config.weight_decay"]


def test_containers_doc_profile_renders_a_checked_script(tmp_path: Path) -> None:
    from tests.unit.test_render import check_shell

    text = (DOCS / "containers.md").read_text()
    prof = tmp_path / "my-cluster.yaml"
    prof.write_text(text.split("# my-cluster.yaml\n", 1)[1].split("```", 1)[0])
    result = CliRunner().invoke(app, ["render", str(ROOT / "examples/hostnames.yaml"), "-p", str(prof)])
    assert result.exit_code == 0, result.output
    assert "apptainer exec --nv --bind /datasets:/data:ro," in result.output
    assert "--writable-tmpfs /images/pytorch-24.05.sif)" in result.output
    check_shell(result.output, tmp_path)


def test_every_doc_page_is_linked_from_the_index() -> None:
    index = (DOCS / "index.md").read_text()
    for page in DOCS.glob("*.md"):
        if page.name != "index.md":
            assert f"({page.name})" in index, f"docs/index.md does not link {page.name}"


def test_security_doc_states_the_modes_and_fields_the_code_uses() -> None:
    text = (DOCS / "security.md").read_text()
    for kind in (perms.PRIVATE, perms.GROUP):
        assert f"`{perms.FILE_MODE[kind]:04o}`" in text and f"umask `{perms.UMASK[kind]:04o}`" in text
    assert "`0700`" in text and "`0750` + setgid" in text and perms.FOLDER_MODE[perms.GROUP] == 0o2750
    assert "none of `" + " ".join(SBATCH_FORBIDDEN) + "`" in text
    named = re.findall(r"`(\w+)`", text.split("reaches such a\nline (", 1)[1].split(")", 1)[0])
    header = (ROOT / "templates/partials/header.sh.j2").read_text()
    assert set(re.findall(r'"(\w+)"', header.split("{% for key in [", 1)[1].split("]", 1)[0])) <= set(named)
    for name in named:  # each one the doc names is refused where sbatch's parser reads specially
        with pytest.raises(ValidationError, match="sbatch's own parser"):
            ClusterProfile.model_validate({name: ["--comment=a'b"] if name == "sbatch_extra" else "a'b"})


def _defined_names() -> set[str]:
    """Every class, function and module-level name defined in the package."""
    import ast

    names: set[str] = set()
    for path in (ROOT / "slurmkit").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
    return names


def _resolves(dotted: str) -> bool:
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _cli_command(words: list[str]) -> tuple[object, list[str]] | None:
    """The click command that `slurmkit WORDS...` names, and the words after it."""
    import typer.main

    command = typer.main.get_command(app)
    rest = words
    while rest and hasattr(command, "commands"):
        sub = command.commands
        if rest[0] in sub:
            command, rest = sub[rest[0]], rest[1:]
        elif "submit" in sub and not rest[0].startswith("-"):  # `slurmkit sweep SPEC` means `sweep submit SPEC`
            command = sub["submit"]
        else:
            break
    return (command, rest) if command is not None else None


# Names the docs use that belong to Slurm, torch or Jinja, not to slurmkit.
FOREIGN_NAMES = {"GraceTime", "ExcNodeList", "SchedulerParameters", "MaxArraySize", "MaxJobCount", "StrictUndefined",
                 "MinJobAge", "MaxSubmitJobs", "MaxJobs", "PriorityTier", "PreemptMode", "PreemptTime", "PreemptType",
                 "EndTime", "KillWait", "SlurmctldParameters", "PreemptParameters", "AccountingStorageType",
                 "DistributedDataParallel", "DistributedSampler", "TimeoutError", "NodeList", "MaxTRESPerJob",
                 "MaxTRESPerUser", "MaxWall", "AccountingStorageEnforce", "FairShare", "ElapsedRaw", "NNodes",
                 "BatchMode", "ControlMaster", "ControlPersist", "MixedPrecisionPolicy", "ClusterName"}


def test_every_class_module_and_cli_option_named_in_docs_exists() -> None:
    defined = _defined_names() | FOREIGN_NAMES
    missing: list[str] = []
    seen = {"modules": 0, "classes": 0, "options": 0}
    for page in sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]:
        text = page.read_text()
        for token in set(re.findall(r"`([^`\n]+)`", text)):
            if re.fullmatch(r"slurmkit(\.\w+)+", token):
                seen["modules"] += 1
                if not _resolves(token):
                    missing.append(f"{page.name}: module or attribute {token}")
            elif re.fullmatch(r"[A-Z][a-z]+(?:[A-Z][a-z]*)+", token):
                seen["classes"] += 1
                if token not in defined:
                    missing.append(f"{page.name}: class {token}")
        commands = re.findall(r"^\s*(slurmkit [^\n#`|]*)", text, re.MULTILINE)
        commands += re.findall(r"`(slurmkit [^`]+)`", text)
        for line in commands:
            words = line.split()[1:]
            found = _cli_command(words)
            assert found is not None
            command, rest = found
            params = {opt for p in getattr(command, "params", []) for opt in getattr(p, "opts", [])}
            params |= {opt for p in getattr(command, "params", []) for opt in getattr(p, "secondary_opts", [])}
            for word in rest:
                option = word.split("=", 1)[0].strip("[]().,;")
                if option.startswith("--"):
                    seen["options"] += 1
                    if option not in params | {"--help"}:
                        missing.append(f"{page.name}: `{line.strip()}`: no option {option}")
    assert missing == []
    assert min(seen.values()) >= 5, seen  # the check found what it checks


def test_python_api_doc_example_runs_on_the_local_profile(tmp_path: Path) -> None:
    """The notebook-style example of docs/python-api.md, as written, in a fresh interpreter."""
    import os
    import subprocess
    import sys

    text = (DOCS / "python-api.md").read_text()
    example = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert "slurmkit.Executor(profile=\"local\"" in example and "map_array" in example
    (tmp_path / "example.py").write_text(example)
    proc = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("demo-sweep-") == 3  # each map_array task printed as it completed


def test_readme_hello_world_runs_as_written(tmp_path: Path) -> None:
    """The README's five-line hello world, in a fresh interpreter: its printed list is what it says."""
    import ast
    import os
    import subprocess
    import sys

    text = (ROOT / "README.md").read_text()
    example = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(example.strip().splitlines()) == 5
    promised = ast.literal_eval(example.strip().splitlines()[-1].split("#", 1)[1].strip())
    (tmp_path / "hello.py").write_text(example)
    proc = subprocess.run([sys.executable, "hello.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ast.literal_eval(proc.stdout.strip().splitlines()[-1]) == promised


STRUCTURAL = [ROOT / "README.md", DOCS / "design.md", DOCS / "index.md"]
PACKAGES = ("worker", "supervisor", "common", "runs", "sweeps", "slurm", "api", "cli", "remote", "insight", "load",
            "build", "render", "trust", "errors", "calls", "jsontypes", "devcluster", "bench")


def test_every_module_and_path_the_structural_pages_name_exists() -> None:
    """README, design.md and index.md say where things live: each `slurmkit.x.y`, each short
    `worker.ft.stop`-style name and each `slurmkit/...` path they give is in the code."""
    missing, seen = [], 0
    for page in STRUCTURAL:
        text = page.read_text()
        for token in set(re.findall(r"`([^`\n]+)`", text)):
            if re.fullmatch(rf"(?:{'|'.join(PACKAGES)})(\.\w+)+", token) and not token.endswith((".jsonl", ".json")):
                seen += 1
                if not _resolves(f"slurmkit.{token}"):
                    missing.append(f"{page.name}: {token}")
        for path in set(re.findall(r"\bslurmkit/[\w/.]*\w/?", text)):
            seen += 1
            if not (ROOT / path).exists() and not (ROOT / f"{path}.py").exists():
                missing.append(f"{page.name}: {path}")
    assert missing == [] and seen >= 40, (missing, seen)


def test_the_floors_design_md_lists_are_the_code_s_imports() -> None:
    """design.md's `layers` block lists every package and top module, lowest first; each imports only
    its own floor's and the floors below (every import that can run, lazy ones included)."""
    from tests.unit.test_house_rules import _edges

    block = (DOCS / "design.md").read_text().split("```layers\n", 1)[1].split("```", 1)[0]
    floor = {name: n for n, line in enumerate(block.splitlines()) for name in line.split()}

    def package(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else ""

    edges = {(a, b) for a, b in _edges(package) if a and b and a != b}
    assert {x for e in edges for x in e} <= set(floor), sorted({x for e in edges for x in e} - set(floor))
    upward = sorted(f"{a} -> {b}" for a, b in edges if floor[b] > floor[a])
    assert upward == [] and ("worker", "supervisor") in edges


def test_the_policy_is_asked_by_the_callers_design_md_names() -> None:
    """design.md: supervisor.policy.decide is called by supervisor.effects.decide and, on the local
    profile, supervisor.local_requeue; by nothing else."""
    import ast

    callers = set()
    for path in (ROOT / "slurmkit").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "decide" \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "policy":
                callers.add(path.relative_to(ROOT).as_posix())
    assert callers == {"slurmkit/supervisor/effects.py", "slurmkit/supervisor/local_requeue.py"}
    assert "`supervisor.effects.decide`, and `supervisor.local_requeue`" in (DOCS / "design.md").read_text()
