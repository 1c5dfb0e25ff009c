"""Loading profiles and run specs: search path, extends, precedence and one-line errors.

Precedence, highest first: --set on the command line > run spec file > profile > defaults.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from slurmkit.config.fields import gres_gpus
from slurmkit.config.profile import DEFAULT_RESOURCES, ClusterProfile, Resources
from slurmkit.config.resolved import Resolved, ResolvedPart
from slurmkit.config.runspec import RunSpec
from slurmkit.config.shape import Shape
from slurmkit.config.train import TrainConfig
from slurmkit.errors import ConfigError, SlurmkitError, clip, cut, did_you_mean, warn
from slurmkit.jsontypes import JsonObject
from slurmkit.load.overrides import deep_merge, split_sets
from slurmkit.load.yamlio import read_yaml
from slurmkit.resources import shipped_dir

DEFAULT_PROFILE = "local"
PROFILE_PATH_ENV = "SLURMKIT_PROFILE_PATH"

Layer = tuple[str, JsonObject]  # (source shown in errors, raw mapping)


MAX_EXTENDS = 32


def slurm_here() -> bool:
    """Whether this machine can submit to Slurm (sbatch on PATH; nothing is run)."""
    return shutil.which("sbatch") is not None


def profile_search_path() -> list[Path]:
    """SLURMKIT_PROFILE_PATH folders first, then the shipped cluster_profiles/."""
    env = os.environ.get(PROFILE_PATH_ENV, "")
    dirs = [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    return [*dirs, shipped_dir("cluster_profiles")]


def available_profiles() -> dict[str, Path]:
    """Every profile name on the search path, mapped to the file that wins for it."""
    found: dict[str, Path] = {}
    for folder in profile_search_path():
        if folder.is_dir():
            for f in sorted(folder.glob("*.yaml")):
                found.setdefault(f.stem, f)
    return found


def describe(path: Path) -> str:
    """A profile's description for a listing; one that cannot be used (another user's, not YAML)
    says why instead, so a listing of a shared folder never stops at one bad file."""
    try:
        return str(read_yaml(path).get("description", ""))
    except SlurmkitError as exc:
        return f"unusable: {exc.what}"


def find_profile(name_or_path: str) -> Path:
    """A path given explicitly, else the first NAME.yaml on the search path."""
    candidate = Path(name_or_path).expanduser()
    looks_like_path = os.sep in name_or_path or name_or_path.endswith((".yaml", ".yml"))
    if looks_like_path:
        if candidate.is_file():
            return candidate
        raise ConfigError("profile file not found", where=cut(name_or_path))
    profiles = available_profiles()
    if name_or_path in profiles:
        return profiles[name_or_path]
    raise ConfigError(
        f"unknown profile {clip(name_or_path)}{did_you_mean(name_or_path, profiles)}",
        valid=f"valid: {', '.join(sorted(profiles))}, or a path to a .yaml file",
    )


def profile_layers(name_or_path: str) -> list[Layer]:
    """The profile and its `extends` ancestors as layers, ancestors first."""
    path = Path(os.path.realpath(find_profile(name_or_path)))  # a symlink loop: read_yaml says so
    chain: list[Path] = []
    layers: list[Layer] = []
    while True:
        if path in chain:
            shown = " -> ".join(str(p) for p in (*chain, path))
            raise ConfigError(f"profile extends itself: {clip(shown, 300)}", where=f"{chain[-1]}:extends")
        if len(chain) >= MAX_EXTENDS:
            raise ConfigError(f"extends chain longer than {MAX_EXTENDS} profiles", where=f"{chain[-1]}:extends")
        chain.append(path)
        raw = read_yaml(path)
        layers.insert(0, (str(path), {k: v for k, v in raw.items() if k != "extends"}))
        parent = raw.get("extends")
        if parent is None:
            return layers
        path = _parent_path(parent, path)


def _parent_path(parent: object, child: Path) -> Path:
    """The file `extends: parent` in `child` names; errors name the child's extends field."""
    where = f"{child}:extends"
    if not isinstance(parent, str) or not parent:
        raise ConfigError(f"extends must be a profile name or path, got {clip(parent)}", where=where)
    if os.sep in parent and not parent.endswith((".yaml", ".yml")):
        raise ConfigError(f"extends names {clip(parent)}, not a .yaml file", where=where,
                          valid="valid: a profile name or a path to a .yaml/.yml file")
    # A relative parent path (with a '/' or a .yaml suffix) is read beside the child, never from the
    # working directory, so a folder of profiles moves as a whole.
    if (os.sep in parent or parent.endswith((".yaml", ".yml"))) and not Path(parent).expanduser().is_absolute():
        parent = str(child.parent / parent)
    try:
        return Path(os.path.realpath(find_profile(parent)))
    except ConfigError as exc:
        raise ConfigError(exc.what, where=where, valid=exc.valid) from None


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that owns the field at loc, for listing valid keys."""
    current: type[BaseModel] = model
    for part in loc:
        field = current.model_fields.get(str(part))
        if field is None:
            return None
        ann = field.annotation
        candidates = [ann, *getattr(ann, "__args__", ())]
        nested = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if nested is None:
            return None
        current = nested
    return current


_UNSET = object()


def _source_of(loc: tuple[Any, ...], layers: list[Layer]) -> str:
    """The highest-precedence layer that sets loc (or its nearest parent); `X: null` sets it too."""
    for depth in range(len(loc), 0, -1):
        for source, raw in reversed(layers):
            node: Any = raw
            for part in loc[:depth]:
                node = node.get(part, _UNSET) if isinstance(node, dict) else _UNSET
                if node is _UNSET:
                    break
            else:
                return source
    return layers[-1][0]


def validate_layers(model: type[BaseModel], layers: list[Layer], prefix: tuple[str, ...] = ()) -> Any:
    """Merge the layers and validate; prefix is where this model sits inside the files."""
    merged: JsonObject = {}
    for _, raw in layers:
        node: Any = raw
        for part in prefix:
            node = node.get(part, {}) if isinstance(node, dict) else {}
        merged = deep_merge(merged, node)
    try:
        return model.model_validate(merged)
    except ValidationError as exc:
        raise _one_line(model, exc, layers, prefix) from None


def _one_line(model: type[BaseModel], exc: ValidationError, layers: list[Layer],
              prefix: tuple[str, ...] = ()) -> ConfigError:
    err = exc.errors()[0]
    inner = tuple(err["loc"])
    loc = (*prefix, *inner)
    field = cut(".".join(str(p) for p in loc))
    source = _source_of(loc, layers)
    where = f"{source}:{field}" if field else source
    if err["type"] == "extra_forbidden":
        owner = _model_at(model, inner[:-1])
        valid = sorted(owner.model_fields) if owner else []
        return ConfigError(
            f"unknown field {clip(str(loc[-1]))}{did_you_mean(str(loc[-1]), valid)}",
            where=where,
            valid=f"valid: {', '.join(valid)}" if valid else None,
        )
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "missing":
        msg = "required field is missing"
    return ConfigError(msg, where=where)


def load_profile(name_or_path: str, overrides: JsonObject | None = None) -> ClusterProfile:
    layers = profile_layers(name_or_path)
    if overrides:
        layers.append(("--set profile", overrides))
    profile: ClusterProfile = validate_layers(ClusterProfile, layers)
    return profile


def spec_layers(spec: str | Path | JsonObject) -> list[Layer]:
    """A run spec file, or a mapping built in Python, as the lowest spec layer."""
    return [("<spec>", spec) if isinstance(spec, dict) else (str(spec), read_yaml(Path(spec)))]


def validate_runspec(layers: list[Layer]) -> RunSpec:
    run_spec: RunSpec = validate_layers(RunSpec, layers)
    if run_spec.task == "train":
        validate_layers(TrainConfig, layers, prefix=("config",))
    return run_spec


def merge_resources(*layers: Resources) -> Resources:
    """Field by field, the last layer that sets a field wins."""
    merged: JsonObject = {}
    for layer in layers:
        merged.update(layer.model_dump(exclude_none=True))
    return Resources.model_validate(merged)


GPU_FORMS = ("gpus_per_node", "gpus_per_task", "gres")


def gpu_forms(merged: Resources, given: tuple[Resources, ...], source: str) -> Resources:
    """One way of asking for GPUs, and the per-GPU CPU and memory forms only beside one. Slurm
    takes --cpus-per-gpu or --cpus-per-task, --mem-per-gpu or --mem: the highest layer (`given`,
    lowest first) that sets either decides, and the other gives way (a profile's cpus_per_task
    to a spec's cpus_per_gpu); one layer setting both is an error."""
    asked = [f for f in GPU_FORMS if (gres_gpus(merged.gres) if f == "gres" else getattr(merged, f))]
    if len(asked) > 1:
        raise ConfigError(f"GPUs asked for twice: {' and '.join(asked)}", where=f"{source}:resources.{asked[1]}",
                          valid="valid: one of gpus_per_node, gpus_per_task, gres (gpu:...)")
    drop: dict[str, None] = {}
    for per_gpu, instead in (("cpus_per_gpu", "cpus_per_task"), ("mem_per_gpu", "mem")):
        if getattr(merged, per_gpu) is None:
            continue
        if not asked:
            raise ConfigError(f"{per_gpu} without GPUs", where=f"{source}:resources.{per_gpu}",
                              valid="valid: with gpus_per_node, gpus_per_task or a gpu gres")
        top = next(g for g in reversed(given) if getattr(g, per_gpu) is not None or getattr(g, instead) is not None)
        if getattr(top, per_gpu) is not None and getattr(top, instead) is not None:
            raise ConfigError(f"{per_gpu} with {instead}: Slurm takes one of them",
                              where=f"{source}:resources.{per_gpu}", valid=f"valid: {per_gpu} or {instead}, not both")
        drop[instead if getattr(top, per_gpu) is not None else per_gpu] = None
    return merged.model_copy(update=drop) if drop else merged


def _check_ray(spec: RunSpec, resources: Resources, source: str) -> None:
    """A Ray driver path is read beside the spec file; Ray runs one node per Slurm node."""
    assert spec.ray is not None
    driver = Path(spec.ray.driver).expanduser()
    if not driver.is_absolute() and source != "<spec>":
        driver = Path(source).resolve().parent / driver
    if not driver.is_file():
        raise ConfigError(f"driver script not found: {driver}", where=f"{source}:ray.driver")
    spec.ray.driver = str(driver)
    if resources.tasks_per_node != 1:
        raise ConfigError(f"tasks_per_node={resources.tasks_per_node} with ray",
                          where=f"{source}:resources.tasks_per_node",
                          valid="valid: 1 (one Ray node per Slurm node; give it CPUs with cpus_per_task)")


def resolve_layers(layers: list[Layer], profile: ClusterProfile, profile_name: str) -> Resolved:
    """Run-spec layers (lowest first) against an already loaded profile."""
    run_spec = validate_runspec(layers)
    if run_spec.components is not None:
        return _resolve_parts(run_spec, profile, profile_name, layers)
    return _resolve_one(run_spec, profile, profile_name, layers[0][0], (run_spec.resources,))


def _resolve_parts(spec: RunSpec, profile: ClusterProfile, profile_name: str, layers: list[Layer]) -> Resolved:
    """A heterogeneous run: each part resolved as a run of its own (its field named in each error);
    the run's own resources are its primary part's. On Slurm one heterogeneous job; on the local
    profile, the parts as local process groups (supervisor.local_parts)."""
    assert spec.components is not None
    source = layers[0][0]
    parts = []
    for group, name in enumerate(spec.components):
        where = f"{source}:components.{name}"
        if spec.components[name].task == "train":
            validate_layers(TrainConfig, layers, prefix=("components", name, "config"))
        own = spec.components[name].container
        one = _resolve_one(spec.part(name), profile.model_copy(update={"container": own}) if own else profile,
                           profile_name, where, (spec.resources, spec.components[name].resources))
        if one.shape.shrinks:
            raise ConfigError("spare_nodes or elastic in a part", where=f"{where}.resources",
                              valid="valid: 0 / false (a part's lost node requeues the whole job)")
        parts.append(ResolvedPart(name, group, one, name == spec.primary))
    primary = next(p for p in parts if p.primary)
    # Named, not implied: run.json keeps components by name, so "the first part" is not read back.
    spec = spec.model_copy(update={"result": primary.name})
    return Resolved(spec=spec, profile=profile, profile_name=profile_name, resources=primary.resolved.resources,
                    spec_source=source, parts=tuple(parts))


def _resolve_one(run_spec: RunSpec, profile: ClusterProfile, profile_name: str, source: str,
                 given: tuple[Resources, ...]) -> Resolved:
    """One run's (or one part's) resources layered over the defaults and the profile's, and checked.
    `given`: the spec's resources layers, lowest first."""
    resources = gpu_forms(merge_resources(DEFAULT_RESOURCES, profile.resources, *given),
                          (profile.resources, *given), source)
    if run_spec.ray is not None:
        _check_ray(run_spec, resources, source)
    if run_spec.launcher == "torchrun" and profile.executor != "slurm":
        raise ConfigError(f"launcher torchrun on the {profile.executor} executor", where=f"{source}:launcher",
                          valid="valid: srun here (local ranks start as processes); torchrun on a Slurm profile")
    for name in ("spare_nodes", "elastic"):
        if getattr(resources, name):
            _check_shrinkable(run_spec, profile, f"{source}:resources.{name}", name)
    if run_spec.task == "train":
        _check_batch(run_spec, resources, source)
    return Resolved(spec=run_spec, profile=profile, profile_name=profile_name, resources=resources,
                    spec_source=source)


def _check_batch(spec: RunSpec, resources: Resources, source: str) -> None:
    """The global batch splits over the ranks: checked at submit, not after the queue wait."""
    cfg = TrainConfig.model_validate(spec.config)
    world = Shape.of(resources).world
    try:
        cfg.per_rank_batch(world)
    except ValueError as exc:
        raise ConfigError(str(exc), where=f"{source}:config.batch_size",
                          valid=f"valid: a multiple of {world * cfg.grad_accum} ({world} ranks x grad_accum="
                                f"{cfg.grad_accum})") from None


def _check_shrinkable(spec: RunSpec, profile: ClusterProfile, where: str, name: str) -> None:
    """Spare nodes and elastic runs start srun's ranks again on the nodes a Slurm allocation still holds."""
    off = "0" if name == "spare_nodes" else "false"
    if profile.executor != "slurm":
        raise ConfigError(f"{name} on the {profile.executor} executor", where=where,
                          valid=f"valid: {off} here; {name} on a Slurm profile")
    if spec.ray is not None or spec.launcher != "srun":
        what = "ray" if spec.ray is not None else f"launcher {spec.launcher}"
        raise ConfigError(f"{name} with {what}", where=where,
                          valid=f"valid: {off}, or launcher srun without ray (its ranks restart on the nodes left)")


def profile_name(profile: str | None) -> str:
    """The profile asked for, else $SLURMKIT_PROFILE, else the default."""
    return profile or os.environ.get("SLURMKIT_PROFILE") or DEFAULT_PROFILE


def resolve(spec: str | Path | JsonObject, profile: str | None = None, sets: list[str] | None = None) -> Resolved:
    """Load a run spec (file or mapping) against a profile, with --set overrides on top."""
    spec_sets, profile_sets = split_sets(sets or [])
    name = profile_name(profile)
    layers = spec_layers(spec)
    if spec_sets:
        layers.append(("--set", spec_sets))
    resolved = resolve_layers(layers, load_profile(name, profile_sets), name)
    if not (profile or os.environ.get("SLURMKIT_PROFILE")) and slurm_here():
        # On a login node the default would start the ranks right here, beside everyone's shells.
        warn(f"no profile named: the ranks run on this machine ({DEFAULT_PROFILE} profile), not on Slurm; "
             "name one with -p NAME or $SLURMKIT_PROFILE (`slurmkit profiles list`)")
    return resolved
