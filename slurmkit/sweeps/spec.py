"""The sweep spec: a run spec plus a `sweep:` section, expanded into one override set per task.

    name: lr-sweep            # the base run spec, as for `slurmkit submit`
    task: train
    config: {steps: 200}
    sweep:
      grid:   {config.lr: [1e-3, 3e-3], config.seed: [0, 1]}   # cartesian product
      list:   [{config.hidden: 64}, {config.hidden: 256}]       # explicit configs
      random: {n: 4, seed: 0, params: {config.weight_decay: {uniform: [0, 0.1]}}}

Keys are dotted run-spec paths. When several modes are given, the tasks are their product
(grid x list x random), in that order, so task indices are stable for a given spec. A `search:`
section (config.search) is a sweep of its own: its tasks are its trials, asked from an Optuna
study batch by batch (sweeps.search), never mixed with grid, list or random.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, model_validator

from slurmkit.config.fields import Strict
from slurmkit.config.profile import SWEEP_MAX_TASKS as DEFAULT_MAX_TASKS
from slurmkit.config.runspec import RunSpec
from slurmkit.config.search import PruneSection, SearchSection, check_distributions
from slurmkit.config.train import TrainConfig
from slurmkit.errors import ConfigError, clip, did_you_mean
from slurmkit.jsontypes import JsonObject
from slurmkit.load.loader import Layer, read_yaml
from slurmkit.load.overrides import parse_set

SWEEP_KEY = "sweep"
_ABSENT = object()


class RandomSection(Strict):
    """`n` samples, each drawing every parameter from its distribution with one seeded generator."""

    n: int = Field(ge=1)
    """How many configs to sample."""
    seed: int = 0
    """Seed of the sampler: the same spec always gives the same configs."""
    params: dict[str, JsonObject] = Field(min_length=1)
    """KEY: {uniform: [lo, hi]} | {log_uniform: [lo, hi]} | {int: [lo, hi]} (inclusive) | {choice: [v, ...]}."""

    @model_validator(mode="after")
    def _distributions(self) -> RandomSection:
        check_distributions(self.params)
        return self


class SweepSection(Strict):
    """What varies across tasks, and how many of them may run at once."""

    grid: dict[str, list[Any]] = Field(default_factory=dict)
    """KEY: [values]; every combination becomes a task."""
    configs: list[JsonObject] = Field(default_factory=list, alias="list")
    """Explicit configs, each a mapping of KEY: value."""
    random: RandomSection | None = None
    """Sampled configs."""
    search: SearchSection | None = None
    """Trials suggested from the results so far (Optuna), batch by batch; not mixed with the three above."""
    prune: PruneSection | None = None
    """With search: stop trials whose intermediate values are clearly worse."""
    max_parallel: int | None = Field(None, ge=1)
    """Tasks running at once (sbatch --array=...%N); --max-parallel overrides it."""
    seed: int = 0
    """Base of the per-task seed for runs without config.seed: task i gets seed + i (as $SLURMKIT_SEED)."""

    @model_validator(mode="after")
    def _not_empty(self) -> SweepSection:
        for key, values in self.grid.items():
            if not values:
                raise ValueError(f"grid key {key} has no values; valid: a non-empty list")
            # 1, 1.0 and true are different values (as the task spec reads them); a repeat would run one config twice.
            shown = [f"{type(v).__name__}:{json.dumps(v, sort_keys=True, default=str)}" for v in values]
            if len(set(shown)) != len(shown):
                twice = next(v for v, k in zip(values, shown, strict=True) if shown.count(k) > 1)
                raise ValueError(f"grid key {key} lists {twice!r} twice; valid: each value once")
        fixed = [name for name, given in (("grid", self.grid), ("list", self.configs), ("random", self.random))
                 if given]
        if self.search is not None and fixed:
            raise ValueError(f"search is not mixed with {', '.join(fixed)}; valid: search alone, or grid, list "
                             "and/or random")
        if self.prune is not None and self.search is None:
            raise ValueError("prune needs a search section; valid: prune beside search")
        if not (fixed or self.search):
            raise ValueError("the sweep is empty; valid: at least one of grid, list, random or search")
        return self


@dataclass(frozen=True)
class SweepPlan:
    """A base run spec (as layers) and the flat overrides of every task, in task order."""

    source: str
    name: str
    base_layers: list[Layer]
    section: SweepSection
    overrides: list[JsonObject]

    @cached_property
    def varying(self) -> list[str]:
        """Keys whose value differs between tasks, in first-seen order (a search's: its params)."""
        if self.section.search is not None:
            return list(self.section.search.params)
        keys = dict.fromkeys(k for o in self.overrides for k in o)
        return [k for k in keys if self._varies(k)]

    def _varies(self, key: str) -> bool:
        # Stops at the first task that differs (in a grid, within the first few); 1, 1.0 and True differ.
        first = self.overrides[0].get(key, _ABSENT)
        return any(type(v) is not type(first) or v != first
                   for v in (o.get(key, _ABSENT) for o in self.overrides))


def _key_error(key: str, where: str, valid: list[str], part: str) -> ConfigError:
    return ConfigError(f"'{key}' is not a run-spec key{did_you_mean(part, valid)}", where=f"{where}.{key}",
                       valid=f"valid at that level: {', '.join(sorted(valid))}")


def check_key(key: str, where: str, task: str | None) -> None:
    """Refuse a dotted key that does not name a field of the run spec (free-form maps excepted)."""
    model: type[BaseModel] | None = RunSpec
    for part in key.split("."):
        if model is None:  # inside kwargs/env: any key is the user's
            return
        if part not in model.model_fields or part == "name":
            valid = [f for f in model.model_fields if f != "name"]
            raise _key_error(key, where, valid, part)
        if model is RunSpec and part == "config":
            if task != "train":
                raise ConfigError(f"'{key}': config is only valid with task", where=f"{where}.{key}")

            model = TrainConfig
            continue
        ann = model.model_fields[part].annotation
        nested = [c for c in (ann, *getattr(ann, "__args__", ())) if isinstance(c, type) and issubclass(c, BaseModel)]
        model = nested[0] if nested else None


def _sample(rng: random.Random, kind: str, args: list[Any]) -> Any:
    if kind == "choice":
        return rng.choice(args)
    lo, hi = args
    if kind == "int":
        return rng.randint(int(lo), int(hi))
    if kind == "log_uniform":
        return math.exp(rng.uniform(math.log(lo), math.log(hi)))
    return rng.uniform(lo, hi)


def count(section: SweepSection) -> int:
    """How many tasks the section makes, counted without making them (a search: its trials)."""
    if section.search is not None:
        return section.search.trials
    sizes = [math.prod(len(v) for v in section.grid.values()) if section.grid else 1,
             len(section.configs) or 1, section.random.n if section.random else 1]
    return math.prod(sizes)


def expand(section: SweepSection, max_tasks: int = DEFAULT_MAX_TASKS, where: str = "<spec>") -> list[JsonObject]:
    """Every task's flat overrides: grid x list x random; counted first, and more than max_tasks
    (the profile's sweep_max_tasks) is one ConfigError, before a task is made. A search has none
    before its study asks them."""
    if (n := count(section)) > max_tasks:
        raise ConfigError(f"the sweep makes {n} tasks, over sweep_max_tasks={max_tasks}", where=f"{where}:{SWEEP_KEY}",
                          valid="valid: fewer values or samples, or raise sweep_max_tasks in the profile")
    if section.search is not None:
        return []
    parts: list[list[JsonObject]] = []
    if section.grid:
        keys = list(section.grid)
        parts.append([dict(zip(keys, combo, strict=True)) for combo in itertools.product(*section.grid.values())])
    if section.configs:
        parts.append([dict(entry) for entry in section.configs])
    if section.random:
        rng = random.Random(section.random.seed)
        params = section.random.params
        parts.append([{k: _sample(rng, *next(iter(d.items()))) for k, d in params.items()}
                      for _ in range(section.random.n)])
    if len(parts) == 1:
        return parts[0]
    return [{k: v for part in combo for k, v in part.items()} for combo in itertools.product(*parts)]


def parse_grid_option(item: str) -> tuple[str, list[Any]]:
    """--grid key=v1,v2,... (each value read as YAML, like --set)."""
    key, sep, raw = item.partition("=")
    if not sep or not key or not raw:
        raise ConfigError(f"malformed --grid {clip(item)}", where="--grid", valid="valid: KEY=V1,V2,...")
    return key, [parse_set(f"{key}={v}")[1] for v in raw.split(",")]


def load(path: Path | JsonObject, grid: list[str] | None = None, max_parallel: int | None = None,
         grid_values: dict[str, list[Any]] | None = None, max_tasks: int = DEFAULT_MAX_TASKS,
         sections: JsonObject | None = None) -> SweepPlan:
    """Read a sweep spec (a file, or a mapping built in Python: slurmkit.sweep); --grid options and
    grid_values replace (or add) grid keys; `sections` sets keys of the sweep section (slurmkit.sweep's
    search and prune), a None left out. Keys are checked here."""
    raw = copy.deepcopy(path) if isinstance(path, dict) else read_yaml(path)
    source = "<spec>" if isinstance(path, dict) else str(path)
    section_raw = raw.pop(SWEEP_KEY, None)
    given = {k: v for k, v in (sections or {}).items() if v is not None}
    if section_raw is None and (grid_values or given):
        section_raw = {}
    if not isinstance(section_raw, dict):
        raise ConfigError("no sweep section", where=f"{source}:{SWEEP_KEY}",
                          valid="valid: a mapping with grid, list and/or random, or search")
    section_raw = dict(section_raw)
    section_raw["grid"] = {**(section_raw.get("grid") or {}), **(grid_values or {}),
                           **dict(parse_grid_option(g) for g in grid or [])}
    if max_parallel is not None:
        section_raw["max_parallel"] = max_parallel
    section_raw.update(given)
    section = section_of(section_raw, source)
    if "components" in raw and section.search is not None:
        # A search's driver asks its trials batch by batch as job arrays (sweeps.search), and Slurm
        # runs no heterogeneous job as an array task; a grid, list or random sweep's tasks are each
        # their own heterogeneous job (sweeps.hetjobs).
        raise ConfigError("a search over a heterogeneous run (components)", where=f"{source}:{SWEEP_KEY}.search",
                          valid="valid: grid, list or random over it (each task its own heterogeneous job)")
    task = raw.get("task")
    check_keys(section, source, task)
    name = str(raw.get("name") or (safe_name(path.stem) if isinstance(path, Path) else "sweep"))
    return SweepPlan(source, name, [(source, raw)], section, expand(section, max_tasks, source))


def safe_name(stem: str) -> str:
    """A sweep's name (its id's start) from a spec file's name: letters, digits, '.', '_' and '-' only,
    as a run's name; every other character is '-'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-.") or "sweep"


def section_of(raw: Mapping[str, object], source: str) -> SweepSection:
    """The sweep section validated; the first error as one line naming its field."""
    try:
        return SweepSection.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise ConfigError(err["msg"].removeprefix("Value error, "),
                          where=f"{source}:{SWEEP_KEY}" + (f".{field}" if field else "")) from None


def check_keys(section: SweepSection, source: str, task: str | None) -> None:
    """Every key the section varies names a run-spec field (check_key)."""
    for mode, keys in (("grid", list(section.grid)),
                       ("random.params", list(section.random.params) if section.random else []),
                       ("search.params", list(section.search.params) if section.search else [])):
        for key in keys:
            check_key(key, f"{source}:{SWEEP_KEY}.{mode}", task)
    for i, entry in enumerate(section.configs):
        for key in entry:
            check_key(key, f"{source}:{SWEEP_KEY}.list[{i}]", task)
