"""--set KEY=VALUE overrides: parsing and applying them to a raw config dict."""

from __future__ import annotations

import copy
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from slurmkit.config.profile import ClusterProfile
from slurmkit.config.runspec import RunSpec
from slurmkit.config.train import TrainConfig
from slurmkit.errors import ConfigError, clip
from slurmkit.jsontypes import JsonObject
from slurmkit.load.yamlio import MAX_DEPTH, YamlSyntaxError, load_text

PROFILE_PREFIX = "profile."


def parse_set(item: str) -> tuple[list[str], Any]:
    """Split 'a.b=c' into (['a', 'b'], value), typed by the field it targets: a text field (or an
    entry of a text map such as env) takes the text as given, so `env.X=a #1` keeps ` #1` and
    `env.N=4` is "4"; any other value is read as YAML, so 2 is an int and true a bool."""
    key, sep, raw = item.partition("=")
    path = key.split(".")
    if not sep or not key or any(not part for part in path):
        raise ConfigError(
            f"malformed override {clip(item)}", where="--set", valid="valid: KEY=VALUE, e.g. resources.nodes=2"
        )
    if len(path) > MAX_DEPTH:  # as deep as a YAML file may nest, and no deeper
        raise ConfigError(f"override {clip(key)} is nested {len(path)} levels deep", where="--set",
                          valid=f"valid: at most {MAX_DEPTH} dotted levels")
    text = targets_text(path)
    if text is not None:
        # A text field that may be unset takes YAML's null forms as "unset"; any other text is kept.
        return path, None if text == "optional" and raw in _YAML_NULLS else raw
    try:
        value = load_text(raw, "--set") if raw else ""
    except YamlSyntaxError:  # over the limits (an alias bomb in one value) is refused like a file
        value = raw
    return path, value


def _unwrap(annotation: object) -> Any:
    """str from Annotated[str, ...] and from str | None; anything else as it is."""
    while True:
        if get_origin(annotation) is Annotated:
            annotation = get_args(annotation)[0]
            continue
        args = [a for a in get_args(annotation) if a is not type(None)]
        if get_origin(annotation) in (Union, UnionType) and len(args) == 1:
            annotation = args[0]
            continue
        return annotation


_YAML_NULLS = frozenset({"", "~", "null", "Null", "NULL"})


def targets_text(path: list[str]) -> str | None:
    """Whether a --set path (profile.* for the profile) names a text field or a text map's entry:
    "required" or "optional" (the field may be None), else None."""
    from pydantic import BaseModel

    model: type[BaseModel] = ClusterProfile if path[0] == PROFILE_PREFIX.rstrip(".") else RunSpec
    parts = path[1:] if model is ClusterProfile else path
    for i, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return None  # validation names the unknown field
        rest = parts[i + 1:]
        annotation = TrainConfig if (model is RunSpec and part == "config") else _unwrap(field.annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
            continue
        if not rest and annotation is str:
            return "optional" if type(None) in get_args(field.annotation) else "required"
        if len(rest) == 1 and get_origin(annotation) is dict and get_args(annotation)[1:] == (str,):
            return "required"
        return None
    return None


def split_sets(items: list[str]) -> tuple[JsonObject, JsonObject]:
    """Parse overrides into (run-spec overrides, profile overrides); profile.* keys go to the profile."""
    spec: JsonObject = {}
    profile: JsonObject = {}
    for item in items:
        path, value = parse_set(item)
        target = spec
        if path[0] == PROFILE_PREFIX.rstrip("."):
            target, path = profile, path[1:]
            if not path:
                raise ConfigError(f"malformed override {clip(item)}", where="--set", valid="valid: profile.FIELD=VALUE")
        set_path(target, path, value)
    return spec, profile


def set_path(target: JsonObject, path: list[str], value: object) -> None:
    for part in path[:-1]:
        nxt = target.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"cannot set {'.'.join(path)}: {part} is not a mapping", where="--set")
        target = nxt
    target[path[-1]] = value


def nested(flat: JsonObject) -> JsonObject:
    """{'config.lr': 1} -> {'config': {'lr': 1}}, the shape of a spec layer."""
    out: JsonObject = {}
    for key, value in flat.items():
        set_path(out, key.split("."), value)
    return out


def deep_merge(base: JsonObject, top: JsonObject) -> JsonObject:
    """Merge top over base: mappings merge key by key, anything else is replaced."""
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
