"""A sweep's `search:` and `prune:` sections (docs/sweeps.md): Optuna suggests each batch of trials
from the results so far, and may stop a trial whose curve is clearly worse. Pure data, as every
model of config/; the study that reads them is slurmkit.sweeps.study.

    sweep:
      search:
        sampler: tpe          # Optuna's samplers by name (SAMPLERS)
        trials: 64
        batch: 8              # trials asked together and run as one job array
        metric: val_loss      # what a trial reports (final metrics, or slurmkit.tracking.log)
        mode: min
        seed: 0
        params:
          config.lr: {log_uniform: [1.0e-4, 1.0e-1]}
          config.hidden: {choice: [128, 256, 512]}
      prune: {pruner: median, warmup_steps: 100}
      max_parallel: 4
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, model_validator

from slurmkit.config.fields import Strict

DISTRIBUTIONS = ("uniform", "log_uniform", "int", "choice")
# Optuna's samplers a search may name. GPSampler is left out: it imports torch, which the login
# node's driver never does; the ones after qmc are Optuna's too, for single objectives.
SAMPLERS = ("tpe", "random", "cmaes", "grid", "qmc", "nsgaii", "bruteforce")
PRUNERS = ("median", "percentile", "hyperband", "successive_halving", "threshold", "wilcoxon", "nop")
# Where a search's params may point: what a task's own spec reads. Resources stay those of the
# sweep's one job array script (every batch is one array of the same script).
SEARCH_SECTIONS = ("config", "env", "kwargs")


MAX_TRIALS = 100_000
"""The most trials one search runs: its manifest and journal stay a few MB, its driver's asks minutes."""
MAX_BATCH = 10_000
"""The most trials asked together (and a Slurm profile's live MaxArraySize, checked at submit)."""
MAX_SEED = 2**32 - 1
"""Optuna's samplers seed numpy's generator, which takes 0 .. 2**32 - 1."""


def _number(value: object, integer: bool) -> bool:
    """A finite int (for an int range) or a finite int or float, never a bool."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, int) if integer else math.isfinite(value)


def _choice_value(value: object) -> bool:
    """What Optuna's categorical distribution stores and gives back unchanged: None, a bool, a string,
    an int or a finite float."""
    return value is None or isinstance(value, bool | str | int) or (isinstance(value, float) and math.isfinite(value))


def check_distributions(params: dict[str, dict[str, Any]]) -> None:
    """Each param is one of DISTRIBUTIONS with its arguments of the right type; a ValueError names
    the first that is not. Every value a trial could be given is checked: each choice (no NaN, no
    repeat), both ends of a range (finite numbers, ints for an int range)."""
    for key, dist in params.items():
        if not isinstance(dist, dict) or len(dist) != 1 or next(iter(dist)) not in DISTRIBUTIONS:
            got = sorted(dist) if isinstance(dist, dict) else dist
            raise ValueError(f"{key}: one of {', '.join(DISTRIBUTIONS)} is needed, got {got}")
        kind, args = next(iter(dist.items()))
        if not isinstance(args, list) or not args:
            raise ValueError(f"{key}: {kind} takes a non-empty list")
        if kind == "choice":
            if bad := [v for v in args if not _choice_value(v)]:
                raise ValueError(f"{key}: choice {bad[0]!r} is not a string, number, bool or null; "
                                 "valid: finite numbers, strings, true/false, null")
            if len({(type(v), v) for v in args}) != len(args):
                raise ValueError(f"{key}: choice lists a value twice; valid: each value once")
            continue
        what = "integers" if kind == "int" else "finite numbers"
        if len(args) != 2 or not all(_number(v, kind == "int") for v in args):
            raise ValueError(f"{key}: {kind} takes [low, high] of two {what}, got {args}")
        if args[0] > args[1]:
            raise ValueError(f"{key}: {kind} takes [low, high] with low <= high")
        if kind == "log_uniform" and args[0] <= 0:
            raise ValueError(f"{key}: log_uniform needs low > 0")


def candidates(dist: dict[str, Any]) -> list[Any]:
    """The values of a distribution a submit checks against the spec: each choice, both ends of a range."""
    kind, args = next(iter(dist.items()))
    return list(args) if kind == "choice" else list(dict.fromkeys(args))


def _combinations(params: dict[str, dict[str, Any]]) -> int:
    """How many distinct configs discrete params make (choices, inclusive int ranges)."""
    sizes = [len(args) if kind == "choice" else int(args[1]) - int(args[0]) + 1
             for kind, args in (next(iter(d.items())) for d in params.values())]
    return math.prod(sizes)


class SearchSection(Strict):
    """Trials suggested by an Optuna sampler, `batch` at a time, each batch one job array."""

    sampler: Literal["tpe", "random", "cmaes", "grid", "qmc", "nsgaii", "bruteforce"] = "tpe"
    """Optuna's sampler by name: tpe (with the constant liar where a batch asks several at once),
    random, cmaes, grid (every param a choice), qmc, nsgaii, bruteforce (every param discrete)."""
    trials: int = Field(ge=1, le=MAX_TRIALS, strict=True)
    """How many trials in all (the study's budget), at most 100,000; a whole number (1e6 is a float)."""
    batch: int = Field(8, ge=1, le=MAX_BATCH, strict=True)
    """Trials asked together and run as one job array; the next batch is asked once it has ended. At
    most 10,000, and on Slurm at most the cluster's MaxArraySize."""
    metric: str = Field(min_length=1)
    """The number a trial reports: its final metrics (a function's returned dict or number, the
    Trainer's summary) or the newest value logged with slurmkit.tracking.log."""
    mode: Literal["min", "max"] = "min"
    """Minimize or maximize the metric."""
    seed: int = Field(0, ge=0, le=MAX_SEED, strict=True)
    """The sampler's seed (0 .. 2**32 - 1): the same spec and results give the same suggestions."""
    params: dict[str, dict[str, Any]] = Field(min_length=1)
    """KEY: {uniform: [lo, hi]} | {log_uniform: [lo, hi]} | {int: [lo, hi]} (inclusive) |
    {choice: [v, ...]}, as `random:`; KEY under config., env. or kwargs. (a function's keyword)."""

    @model_validator(mode="after")
    def _params(self) -> SearchSection:
        check_distributions(self.params)
        for key in self.params:
            if key.split(".")[0] not in SEARCH_SECTIONS or "." not in key:
                raise ValueError(f"{key}: a search varies {', '.join(s + '.KEY' for s in SEARCH_SECTIONS)}; "
                                 "resources are the array's own")
        discrete = all(next(iter(d)) in ("choice", "int") for d in self.params.values())
        if self.sampler == "bruteforce" and not discrete:
            raise ValueError("bruteforce needs every param a choice or an int range")
        if self.sampler == "grid" and not all(next(iter(d)) == "choice" for d in self.params.values()):
            raise ValueError("grid needs every param a choice")
        if self.sampler in ("grid", "bruteforce") and self.trials > (size := _combinations(self.params)):
            raise ValueError(f"{self.sampler} has {size} combinations to try, fewer than trials={self.trials}; "
                             f"valid: trials <= {size}")
        return self


class PruneSection(Strict):
    """Stop a trial early where Optuna's pruner finds its intermediate values clearly worse."""

    pruner: Literal["median", "percentile", "hyperband", "successive_halving", "threshold", "wilcoxon",
                    "nop"] = "median"
    """Optuna's pruner by name."""
    warmup_steps: int = Field(0, ge=0)
    """No trial is pruned before it reports this step (median, percentile)."""
    startup_trials: int = Field(5, ge=0)
    """No trial is pruned until this many trials have finished (median, percentile)."""
    percentile: float = Field(25.0, gt=0, lt=100)
    """percentile: keep trials in the best `percentile` percent at the same step."""
    min_resource: int = Field(1, ge=1)
    """hyperband, successive_halving: the fewest steps a trial runs before it may be pruned."""
    max_resource: int | None = Field(None, ge=1)
    """hyperband: the most steps a trial runs (unset: Optuna's auto)."""
    lower: float | None = None
    """threshold: prune a trial whose value falls below it."""
    upper: float | None = None
    """threshold: prune a trial whose value rises above it."""
    check_s: float = Field(10.0, gt=0)
    """How often the driver reads running trials' values and asks the pruner (the longest wait
    between a bad value and its trial's stop, plus the job's stop and save)."""

    @model_validator(mode="after")
    def _threshold(self) -> PruneSection:
        if self.pruner == "threshold" and self.lower is None and self.upper is None:
            raise ValueError("threshold needs lower or upper")
        return self
