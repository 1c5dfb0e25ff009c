"""--set KEY=VALUE overrides: parsing and applying them to a raw config dict."""

from __future__ import annotations

import copy
from typing import Any

from slurmkit.config.yamlio import YamlSyntaxError, load_text
from slurmkit.errors import ConfigError, clip

PROFILE_PREFIX = "profile."


def parse_set(item: str) -> tuple[list[str], Any]:
    """Split 'a.b=c' into (['a', 'b'], value), reading the value as YAML so 2 is an int, true a bool."""
    key, sep, raw = item.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(
            f"malformed override {clip(item)}", where="--set", valid="valid: KEY=VALUE, e.g. resources.nodes=2"
        )
    try:
        value = load_text(raw, "--set") if raw else ""
    except YamlSyntaxError:  # over the limits (an alias bomb in one value) is refused like a file
        value = raw
    return key.split("."), value


def split_sets(items: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Parse overrides into (run-spec overrides, profile overrides); profile.* keys go to the profile."""
    spec: dict[str, Any] = {}
    profile: dict[str, Any] = {}
    for item in items:
        path, value = parse_set(item)
        target = spec
        if path[0] == PROFILE_PREFIX.rstrip("."):
            target, path = profile, path[1:]
            if not path:
                raise ConfigError(f"malformed override {clip(item)}", where="--set", valid="valid: profile.FIELD=VALUE")
        set_path(target, path, value)
    return spec, profile


def set_path(target: dict[str, Any], path: list[str], value: Any) -> None:
    for part in path[:-1]:
        nxt = target.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"cannot set {'.'.join(path)}: {part} is not a mapping", where="--set")
        target = nxt
    target[path[-1]] = value


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """Merge top over base: mappings merge key by key, anything else is replaced."""
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
