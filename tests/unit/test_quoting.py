"""Property tests: hostile values in profiles and specs never escape their shell quoting."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmkit.errors import ConfigError
from slurmkit.load.loader import resolve
from slurmkit.load.yamlio import dump
from tests.unit.test_render import FOLDER, check_shell, render_profile

# Hostile to bash but read literally by sbatch's #SBATCH parser once shlex-quoted.
SHELL_HOSTILE = ["a b", "$(touch PWNED)", "`touch PWNED`", "; touch PWNED", "x && touch PWNED", "${HOME}", "*", "~",
                 "-rf", "!!", "--uid=0", "a --qos=high"]
# Read specially by sbatch's own parser (escapes, nested quotes, comments, %x patterns): refused there.
SBATCH_HOSTILE = ["it's", 'say "hi"', "\\", "#comment", "'\"'\"'", "%x", "a\\' --uid=0 '"]
HOSTILE = SHELL_HOSTILE + SBATCH_HOSTILE
# Printable text: no control characters or line separators (refused everywhere, tested apart).
PRINTABLE = st.characters(min_codepoint=32, max_codepoint=0x2FFF, exclude_categories=("Cc", "Zl", "Zp"))
printable = st.text(PRINTABLE, max_size=40)
value_strategy = st.one_of(st.sampled_from(HOSTILE), printable)


def _setup_part(script: str) -> str:
    """The script up to the launch; it only exports and loads, so it is safe to execute."""
    return script.split("# launch:", 1)[0]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(env_value=value_strategy, nccl_value=value_strategy, module=value_strategy, spec_value=value_strategy)
def test_values_round_trip_through_bash_unchanged(tmp_path: Path, env_value: str, nccl_value: str, module: str,
                                                  spec_value: str) -> None:
    prof = tmp_path / "p.yaml"
    prof.write_text(dump({  # as the loader reads it: a bare 0E0 is a float there
        "extends": "devcluster", "setup": {"env": {"HOSTILE_ENV": env_value}, "modules": [module]},
        "nccl_env": {"NCCL_HOSTILE": nccl_value},
    }))
    spec = tmp_path / "s.yaml"
    spec.write_text(dump({"name": "q", "command": "true", "env": {"SPEC_HOSTILE": spec_value}}))
    script = _setup_part(render_profile(spec, str(prof)))
    probe = (
        'module() { shift; printf "%s\\0" "$@"; }\n' + script.replace("set -uo pipefail", "")
        + 'printf "%s\\0" "$HOSTILE_ENV" "$NCCL_HOSTILE" "$SPEC_HOSTILE"\n'
    )
    proc = subprocess.run(["bash", "-c", probe], cwd=tmp_path, capture_output=True, check=True)
    assert proc.stdout.decode().split("\0")[:-1] == [module, env_value, nccl_value, spec_value]
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("value", SHELL_HOSTILE)
def test_hostile_sbatch_values_pass_shellcheck(tmp_path: Path, value: str) -> None:
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump({"extends": "devcluster", "partition": value, "qos": value,
                                    "setup": {"venv": f"/opt/{value}"}, "run_root": f"/tmp/{value}"}))
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "q", "command": "true"}))
    script = render_profile(spec, str(prof))
    assert str(FOLDER) in script
    check_shell(script, tmp_path)


@pytest.mark.parametrize("value", SBATCH_HOSTILE)
@pytest.mark.parametrize("field", ["partition", "qos", "constraint", "run_root", "sbatch_extra"])
def test_what_sbatch_reads_specially_is_refused_naming_the_field(tmp_path: Path, value: str, field: str) -> None:
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump({"extends": "devcluster",
                                    field: [f"--comment={value}"] if field == "sbatch_extra" else value}))
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "q", "command": "true"}))
    with pytest.raises(ConfigError, match=f"p.yaml:{field}: .*valid: ") as err:
        resolve(spec, str(prof))
    assert "\n" not in str(err.value)
    assert "sbatch's own parser" in str(err.value) or "without spaces" in str(err.value)


@pytest.mark.parametrize("value", ["a\nb", "x\r", "nul\x00", "tab\there", "bell\x07"])
@pytest.mark.parametrize("field", ["partition", "account", "exclude"])
def test_control_characters_are_refused_not_rendered(tmp_path: Path, value: str, field: str) -> None:
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump({"extends": "devcluster", field: value}))
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "q", "command": "true"}))
    with pytest.raises(ConfigError, match=f"p.yaml:{field}: control characters"):
        resolve(spec, str(prof))
