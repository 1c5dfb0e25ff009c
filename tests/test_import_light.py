"""The login-node CLI must not import torch: `import slurmkit.cli` and `slurmkit --help` stay light."""

from __future__ import annotations

import subprocess
import sys

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


def test_probe_detects_torch_when_it_is_imported() -> None:
    # The probe itself must be able to fail.
    assert _loaded("import torch") == "True False"
