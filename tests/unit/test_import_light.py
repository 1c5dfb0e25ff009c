"""The login-node CLI must not import torch: `import slurmkit.cli` and `slurmkit --help` stay light."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

PROBE = "import sys; {stmt}; print('torch' in sys.modules, 'slurmkit.worker.entry' in sys.modules)"


def _loaded(stmt: str) -> str:
    proc = subprocess.run([sys.executable, "-c", PROBE.format(stmt=stmt)], capture_output=True, text=True,
                          check=True)
    return proc.stdout.strip()


def test_import_cli_does_not_import_torch() -> None:
    assert _loaded("import slurmkit.cli.app") == "False False"


def test_help_does_not_import_torch() -> None:
    stmt = ("from typer.testing import CliRunner; from slurmkit.cli.app import app; "
            "r = CliRunner().invoke(app, ['--help']); assert r.exit_code == 0, r.output")
    assert _loaded(stmt) == "False False"


def test_render_does_not_import_torch(tmp_path: object) -> None:
    stmt = ("from typer.testing import CliRunner; from slurmkit.cli.app import app; "
            "r = CliRunner().invoke(app, ['render', 'tests/golden/spec.yaml', '-p', 'devcluster']); "
            "assert r.exit_code == 0, r.output")
    assert _loaded(stmt).startswith("False")


def test_the_supervisor_is_torch_free_and_loads_nothing_of_the_ranks() -> None:
    """Every module of slurmkit.supervisor, imported together, loads neither torch nor any
    slurmkit.worker module: the batch host's side runs apart from the ranks'."""
    names = sorted(p.stem for p in (ROOT / "slurmkit" / "supervisor").glob("*.py") if p.stem != "__main__")
    stmt = "; ".join(f"import slurmkit.supervisor.{n}" if n != "__init__" else "import slurmkit.supervisor"
                     for n in names)
    probe = stmt + "; print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('slurmkit.worker')))"
    proc = subprocess.run([sys.executable, "-P", "-c", "import sys; " + probe], capture_output=True, text=True,
                          check=True, cwd=ROOT)
    assert len(names) >= 9 and proc.stdout.strip() == "[]"


def test_probe_detects_torch_when_it_is_imported() -> None:
    # The probe itself must be able to fail.
    assert _loaded("import torch") == "True False"


ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_IMPORT_FORMS = re.compile(r"^\s*(import slurmkit(?:\.[a-z_.]+)?|from slurmkit(?:\.[a-z_.]+)? import [A-Za-z_, ]+)\s*$",
                           re.MULTILINE)
_DOTTED = re.compile(r"`(slurmkit\.(?:distributed|checkpoint|tracking)\.[a-z_]+)")


def test_every_documented_import_form_works_as_written() -> None:
    """Each `import slurmkit...` and `from slurmkit... import ...` line in the docs, and each
    `slurmkit.distributed.X` they name, in a fresh interpreter; the three job-side names are the
    same module objects whether imported or reached as attributes."""
    statements = sorted({m.group(1).strip() for doc in DOC_FILES for m in _IMPORT_FORMS.finditer(doc.read_text())})
    dotted = sorted({m.group(1) for doc in DOC_FILES for m in _DOTTED.finditer(doc.read_text())})
    assert "import slurmkit" in statements and dotted  # the docs were read
    probe = "\n".join([
        "import importlib, json, sys", "failed = []",
        *(f"try:\n    {s}\nexcept Exception as e:\n    failed.append({s!r} + ': ' + repr(e))" for s in statements),
        "import slurmkit",
        *(f"try:\n    {d}\nexcept Exception as e:\n    failed.append({d!r} + ': ' + repr(e))" for d in dotted),
        "for name in ('distributed', 'checkpoint', 'tracking'):",
        "    mod = importlib.import_module('slurmkit.' + name)",
        "    if mod is not getattr(slurmkit, name) or mod is not sys.modules['slurmkit.worker.' + name]:",
        "        failed.append(name + ': two module objects')",
        "from slurmkit import Checkpoint, Executor",
        "from slurmkit.tracking import log",
        "print(json.dumps(failed))"])
    done = subprocess.run([sys.executable, "-P", "-c", probe], cwd="/", capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
