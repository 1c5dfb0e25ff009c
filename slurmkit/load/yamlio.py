"""Reading YAML that users write: UTF-8 only, bounded size, depth and alias expansion, one-line errors.

Every YAML a user gives (profiles, run specs, sweep specs, --set values) goes through here, so a
binary file, a 5,000-deep nesting or an alias bomb is one ConfigError, never a traceback or a hang.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from slurmkit import trust
from slurmkit.errors import ConfigError, clip
from slurmkit.jsontypes import JsonObject
from slurmkit.resources import shipped_dir


class UserLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's numbers, as users mean them.

    YAML 1.1 reads `time: 1:30:00` as the base-60 integer 5400, which Slurm would then read as
    5400 minutes. It also reads `lr: 1e-3` as a string, because it wants a dot. Here base-60
    numbers stay text, and 1e-3 is a float. Everything else is safe_load's.
    """


_INT_RE = re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$")
_FLOAT_RE = re.compile(r"^(?:[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?"
                       r"|[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?"
                       r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")


def _unique_keys(loader: UserLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    """A mapping whose keys are all different: YAML forbids a repeated key, which PyYAML would let
    the last one win silently (a second `resources:` dropping the first). A merge (`<<: *base`) may
    still be overridden key by key, as YAML means it."""
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {clip(key)}", key_node.start_mark)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


UserLoader.construct_mapping = _unique_keys  # type: ignore[assignment,method-assign]
UserLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers
            if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
UserLoader.add_implicit_resolver("tag:yaml.org,2002:int", _INT_RE, list("-+0123456789"))
# After int, so that an integer stays one: the float pattern matches "12" too.
UserLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_RE, list("-+0123456789."))


class UserDumper(yaml.SafeDumper):
    """Writes what UserLoader reads back unchanged: a string it would take for a number (`0E0`,
    `1e-3`, which PyYAML's own dumper leaves bare) is quoted."""


UserDumper.yaml_implicit_resolvers = UserLoader.yaml_implicit_resolvers


def dump(data: object) -> str:
    """YAML text of `data` in the order given, as UserLoader reads it back."""
    return yaml.dump(data, Dumper=UserDumper, sort_keys=False, allow_unicode=True)


class YamlSyntaxError(ConfigError):
    """The text is not YAML at all (a --set value is then taken as plain text)."""


MAX_FILE_BYTES = 4 << 20
MAX_DEPTH = 40
MAX_NODES = 200_000


def shipped(path: Path) -> bool:
    """A file of slurmkit's own shipped profiles: installed with the package, trusted as its code is."""
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(shipped_dir("cluster_profiles")))


def read_regular(path: Path, limit: int) -> bytes:
    """A regular file's bytes, at most `limit`, checked on the open file: /dev/zero, a FIFO (opened
    without blocking), a folder or a file over the limit is one ConfigError, never a hang or a
    MemoryError; a symlink loop is the OSError (ELOOP) open raises. It is read as configuration, so it
    must be the caller's or root's and writable by no one else (trust.open_config), checked on the open
    file once the symlinks on the way to it are resolved."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(path, flags) if shipped(path) else trust.open_config(os.path.realpath(path), flags)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError("not a regular file", where=str(path), valid="valid: a YAML file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ConfigError(f"file is over {limit} bytes", where=str(path), valid="valid: a YAML profile or run spec")
    return data


SCRIPT_SUFFIXES = {".py": "python", ".sh": "bash", ".bash": "bash"}


def read_yaml(path: Path) -> JsonObject:
    """A YAML mapping from a UTF-8 file of the caller's own (or root's) that no one else can write (a
    profile, run spec or sweep spec is configuration: another user's could run code as the caller);
    anything else is one ConfigError naming the file. A script given where a spec goes
    (`slurmkit submit train.py`) is told how a spec runs it."""
    if (runner := SCRIPT_SUFFIXES.get(Path(path).suffix)) is not None:
        raise ConfigError(f"{Path(path).name} is a script, not a YAML run spec", where=str(path),
                          valid=f"valid: a run spec that runs it, e.g. spec.yaml holding `name: train` and "
                                f"`command: {runner} {Path(path).name}` (docs/jobs.md)")
    try:
        text = read_regular(path, MAX_FILE_BYTES).decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read file: {exc.strerror}", where=str(path)) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})",
                          where=str(path), valid="valid: a UTF-8 YAML file") from None
    data = load_text(text, str(path))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping at the top level", where=str(path))
    return data


def load_text(text: str, where: str) -> Any:
    """YAML (UserLoader: safe_load with 1.2 numbers) within the limits; `where` names the source in
    errors (a file, or --set)."""
    try:
        data = yaml.load(text, Loader=UserLoader)  # noqa: S506 - UserLoader is a SafeLoader
    except yaml.reader.ReaderError as exc:  # a NUL or another character YAML does not allow, with no mark
        row = text.count("\n", 0, exc.position) + 1
        char = chr(exc.character) if isinstance(exc.character, int) else str(exc.character)
        raise YamlSyntaxError(f"invalid YAML: character {char!r} is not allowed in YAML",
                              where=f"{where}:{row}", valid="valid: printable UTF-8 text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not YAML"
        raise YamlSyntaxError(f"invalid YAML: {problem}", where=f"{where}{line}") from exc
    except ValueError as exc:  # a constructor's own: an integer of over 4,300 digits, a date like 2024-13-45
        raise ConfigError(f"invalid value: {clip(str(exc).split(';')[0], 120)}", where=where,
                          valid="valid: numbers of at most 4,300 digits (Python's limit), real dates") from None
    except RecursionError:
        raise ConfigError(f"nested too deeply for YAML's parser (limit about {MAX_DEPTH} levels)",
                          where=where) from None
    check_size(data, where)
    return data


def check_size(data: object, where: str) -> None:
    """Refuse deep nesting and alias bombs: YAML aliases share one object, which validation would
    walk once per reference, so count nodes as expanded and stop at MAX_NODES."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    nodes = 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise ConfigError(f"expands to more than {MAX_NODES} values (YAML aliases multiply what they refer to)",
                              where=where, valid="valid: a config without nested alias chains")
        if depth > MAX_DEPTH:
            raise ConfigError(f"nested deeper than {MAX_DEPTH} levels", where=where)
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
