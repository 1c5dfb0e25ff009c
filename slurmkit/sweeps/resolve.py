"""Resolving every task of a sweep against its profile, fast enough for 100,000 tasks.

A task's run spec is the base spec (its file, over the profile), then the task's sweep overrides,
then --set on top. Validating each task in full costs about 0.3 ms here (pydantic plus our
per-field validators): half a minute for 100k tasks. Most sweeps vary only `config.*` of a train
task and `env.*`, and there validation factors exactly:

- every field validator of ours sees one field, and EnvMap checks one entry at a time, so a value
  that is valid in one task is valid in every task: each distinct (key, value) is validated once;
- the only checks that look across fields are TrainConfig's model validators: they run on every
  task, on a copy of the validated base with the task's validated values.

Any other override (resources, container, kwargs, ...), or a base that is not valid by itself,
takes the full path: every task validated on its own, as `slurmkit submit` would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from slurmkit.config.profile import ClusterProfile
from slurmkit.config.resolved import Resolved
from slurmkit.config.search import candidates
from slurmkit.config.train import TrainConfig
from slurmkit.errors import ConfigError
from slurmkit.jsontypes import JsonObject
from slurmkit.load.loader import Layer, load_profile, profile_name, resolve_layers
from slurmkit.load.overrides import nested, split_sets
from slurmkit.sweeps.spec import SweepPlan

if TYPE_CHECKING:
    pass

FACTORED_SECTIONS = ("config", "env")
_SCALARS = (int, float, str, bool, type(None))


@dataclass(frozen=True)
class SweepTasks:
    """Every task validated, kept compact: its seed and resource group, and its spec only where
    it cannot be rebuilt as base_spec + overrides + top."""

    groups: list[Resolved]
    """One Resolved per distinct resources: that of the group's first task."""
    group_of: list[int]
    seeds: list[int]
    specs: list[JsonObject | None]
    """Each task's validated spec (model_dump) on the full path; None where base_spec rebuilds it."""
    base_spec: JsonObject | None
    """The validated base (base layers and --set), on the factored path."""
    top: JsonObject
    """--set's run-spec overrides (nested), applied above each task's sweep overrides."""

    def __len__(self) -> int:
        return len(self.group_of)


def task_seed(resolved: Resolved, base_seed: int, index: int) -> int:
    if resolved.spec.task == "train":
        return int(resolved.spec.config.get("seed", TrainConfig.model_fields["seed"].default))
    return base_seed + index


def resolve_tasks(plan: SweepPlan, profile: str | None = None, sets: list[str] | None = None,
                  factor: bool = True, loaded: ClusterProfile | None = None) -> SweepTasks:
    """Every task's run spec against the profile: base spec < sweep overrides < --set.
    factor=False validates every task in full, the reference the factored path must equal.
    `loaded`: the profile as the command already loaded it (its --set layers included)."""
    spec_sets, profile_sets = split_sets(sets or [])
    name = profile_name(profile)
    prof = loaded if loaded is not None else load_profile(name, profile_sets)
    top: list[Layer] = [("--set", spec_sets)] if spec_sets else []
    factored = _factored(plan, top, prof, name, spec_sets) if factor else None
    return factored if factored is not None else _full(plan, top, prof, name, spec_sets)


def _full(plan: SweepPlan, top: list[Layer], prof: object, name: str, spec_sets: JsonObject) -> SweepTasks:
    groups: list[Resolved] = []
    group_index: dict[str, int] = {}
    group_of: list[int] = []
    seeds: list[int] = []
    specs: list[JsonObject | None] = []
    for i, o in enumerate(plan.overrides):
        resolved = _resolve_task(plan, o, top, prof, name)
        key = resolved.resources.model_dump_json()
        if key not in group_index:
            group_index[key] = len(groups)
            groups.append(resolved)
        group_of.append(group_index[key])
        seeds.append(task_seed(resolved, plan.section.seed, i))
        specs.append(resolved.spec.model_dump())
    return SweepTasks(groups, group_of, seeds, specs, None, spec_sets)


def _factored(plan: SweepPlan, top: list[Layer], prof: Any, name: str, spec_sets: JsonObject) -> SweepTasks | None:
    """The factored path, or None where it does not apply (then every task is validated in full)."""
    keys = {k for o in plan.overrides for k in o}
    if not all(k.count(".") == 1 and k.split(".")[0] in FACTORED_SECTIONS for k in keys):
        return None
    try:
        base = resolve_layers([*plan.base_layers, *top], prof, name)
    except ConfigError:
        return None  # e.g. a base that is valid only with each task's values
    train = base.spec.task == "train"
    if any(k.startswith("config.") for k in keys) and not train:
        return None
    cfg_model = _train_config(base) if train else None
    checks = _model_validators(cfg_model) if cfg_model is not None else []
    if any(d.info.mode != "after" for d in checks):
        return None  # a before/wrap validator sees raw input: no factoring is exact then
    validated: dict[tuple[str, type, Any], tuple[str, Any] | None] = {}
    seeds: list[int] = []
    for i, o in enumerate(plan.overrides):
        cfg_values: JsonObject = {}
        for key, value in o.items():
            # By type and value (1, 1.0 and True are equal in Python, not here); repr for the unhashable.
            memo = (key, type(value), value if type(value) in _SCALARS else repr(value))
            if memo not in validated:
                try:
                    validated[memo] = _validate_one(plan, top, prof, name, key, value)
                except ConfigError:
                    return None  # maybe valid only beside another task value: the full path decides
            field = validated[memo]
            if field is not None:
                cfg_values[field[0]] = field[1]
        if cfg_model is None:
            seeds.append(plan.section.seed + i)
            continue
        # One changed field was checked whole, model validators included, when its value was validated.
        if len(cfg_values) > 1:
            _check_across_fields(cfg_model, checks, cfg_values, plan, top, prof, name, o)
        seeds.append(int(cfg_values.get("seed", cfg_model.seed)))
    # The array script renders from the first task, as on the full path (its env names reach a container).
    first = _resolve_task(plan, plan.overrides[0], top, prof, name)
    return SweepTasks([first], [0] * len(seeds), seeds, [None] * len(seeds), base.spec.model_dump(), spec_sets)


def _resolve_task(plan: SweepPlan, overrides: JsonObject, top: list[Layer], prof: Any, name: str) -> Resolved:
    """One task validated in full: base layers < its sweep overrides < --set."""
    return resolve_layers([*plan.base_layers, (f"{plan.source}:sweep", nested(overrides)), *top], prof, name)


def _train_config(base: Resolved) -> TrainConfig:
    return TrainConfig.model_validate(base.spec.config)


def _model_validators(model: BaseModel) -> list[Any]:
    return list(type(model).__pydantic_decorators__.model_validators.values())


def _validate_one(plan: SweepPlan, top: list[Layer], prof: object, name: str, key: str,
                  value: object) -> tuple[str, Any] | None:
    """One override value, validated in the base; for config, (field, the value --set leaves)."""
    section, field = key.split(".")
    resolved = _resolve_task(plan, {key: value}, top, prof, name)
    return (field, getattr(_train_config(resolved), field)) if section == "config" else None


def _with_values(model: TrainConfig, values: JsonObject) -> TrainConfig:
    """model_copy(update=values) without its three copy.copy calls: 3 µs a task is a third of a
    second at 100k. The new instance's fields are the validated base's and the validated values."""
    new = type(model).__new__(type(model))
    object.__setattr__(new, "__dict__", {**model.__dict__, **values})
    object.__setattr__(new, "__pydantic_fields_set__", model.__pydantic_fields_set__ | values.keys())
    object.__setattr__(new, "__pydantic_extra__", None)
    object.__setattr__(new, "__pydantic_private__", None)
    return new


def _check_across_fields(cfg_model: TrainConfig, checks: list[Any], values: JsonObject, plan: SweepPlan,
                         top: list[Layer], prof: object, name: str, overrides: JsonObject) -> None:
    """TrainConfig's model validators on this task's values; a failure is reported as the full
    path would report it (its one-line error, naming the source)."""
    task_cfg = _with_values(cfg_model, values)
    for decorator in checks:
        try:
            decorator.func(task_cfg)
        except ValueError as exc:
            _resolve_task(plan, overrides, top, prof, name)
            raise ConfigError(str(exc), where=f"{plan.source}:sweep") from None  # the line above raises first


def search_base(plan: SweepPlan, profile: str | None, sets: list[str] | None, prof: ClusterProfile) -> SweepTasks:
    """A search's base: the spec (and --set) alone, every trial's starting point, as a sweep of no
    tasks yet. Every value a trial could be given is validated whole now, one param at a time (each
    choice, both ends of a range; the other params at their low ends), so that a param the spec
    refuses is one line at submit, not a failed trial later."""
    search = plan.section.search
    assert search is not None
    spec_sets, _ = split_sets(sets or [])
    name = profile_name(profile)
    top: list[Layer] = [("--set", spec_sets)] if spec_sets else []
    base = resolve_layers([*plan.base_layers, *top], prof, name)
    low = {k: candidates(d)[0] for k, d in search.params.items()}
    for key, dist in search.params.items():
        for value in candidates(dist):
            probe = nested({**low, key: value})
            try:
                resolve_layers([*plan.base_layers, (f"{plan.source}:sweep.search.params", probe), *top], prof, name)
            except ConfigError as exc:
                raise ConfigError(f"{key}={value!r}: {exc.what}", where=f"{plan.source}:sweep.search.params.{key}",
                                  valid=exc.valid) from None
    return SweepTasks([base], [], [], [], base.spec.model_dump(), spec_sets)
