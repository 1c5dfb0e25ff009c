"""The profile's `container` block: one model, three runtimes, each checked for its own syntax."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from slurmkit.config.fields import EnvMap, Strict
from slurmkit.config.text import clip

MOUNT_OPTIONS = {"pyxis": ("ro", "rw"), "apptainer": ("ro", "rw"), "docker": ("ro", "rw", "z", "Z")}
_APPTAINER_URI = re.compile(r"^(docker|docker-archive|oras|library|shub|https?)://")
_EXTRA_ARG = re.compile(r"^--?[A-Za-z][\w-]*(=.+)?$")


class Container(Strict):
    """The container every rank runs in: pyxis/enroot, apptainer/singularity, or docker (NVIDIA Container Toolkit)."""

    runtime: Literal["pyxis", "apptainer", "docker"]
    """pyxis: srun --container-image; apptainer: `apptainer exec` around each rank; docker: `docker run` per rank."""
    image: str = Field(min_length=1)
    """pyxis: [REGISTRY#]IMAGE[:TAG] or a .sqsh file; apptainer: a .sif file or a docker:// (oras://, library://) URI;
    docker: an image name."""
    mounts: list[str] = Field(default_factory=list)
    """Bind mounts SRC:DST[:OPTS], absolute paths (OPTS: ro|rw; docker also z|Z). The run folder, run_root and a
    local checkpoint root are always added."""
    workdir: str | None = None
    """Working directory inside the container (absolute)."""
    env: EnvMap = Field(default_factory=dict)
    """Environment variables set inside the container (values quoted)."""
    python: str | None = None
    """Interpreter inside the container that runs each rank; unset uses the profile's `python`. The batch shell's
    own helpers (requeue policy, sweep tasks) still run on the host with the profile's `python`."""
    gpus: bool | None = None
    """Expose the GPUs (apptainer --nv, docker --gpus all); unset: on when the job asks for GPUs."""
    extra_args: list[str] = Field(default_factory=list)
    """More options for the runtime (pyxis: srun --container-*; apptainer exec; docker run), each --key[=value]."""

    @model_validator(mode="after")
    def _runtime_syntax(self) -> Container:
        rt = self.runtime
        image_problem = _image_problem(rt, self.image)
        if image_problem:
            raise ValueError(f"image {clip(self.image)} does not fit runtime {rt}; valid: {image_problem}")
        valid = MOUNT_OPTIONS[rt]
        for m in self.mounts:
            parts = m.split(":")
            if (len(parts) not in (2, 3) or not all(p.startswith("/") for p in parts[:2])
                    or (len(parts) == 3 and parts[2] not in valid)):
                raise ValueError(f"invalid {rt} mount {clip(m)}; valid: /SRC:/DST or /SRC:/DST:{'|'.join(valid)}")
        if self.workdir is not None and not self.workdir.startswith("/"):
            raise ValueError(f"workdir {clip(self.workdir)} is not absolute; valid: a path starting with /")
        for arg in self.extra_args:
            if not _EXTRA_ARG.match(arg):
                raise ValueError(f"invalid extra_args entry {clip(arg)}; valid: --key or --key=value, one per entry")
        return self


def _image_problem(runtime: str, image: str) -> str | None:
    """What a valid image looks like for the runtime, when `image` is not one."""
    uri = _APPTAINER_URI.match(image)
    if runtime == "pyxis" and (image.endswith(".sif") or (uri and not image.startswith("docker://"))):
        return "[USER@][REGISTRY#]IMAGE[:TAG], docker://... or a .sqsh file"
    if runtime == "apptainer" and not (image.endswith((".sif", ".img")) or uri):
        return "a .sif file or a docker://, oras://, library:// URI"
    if runtime == "docker" and ("#" in image or "://" in image or image.endswith((".sif", ".sqsh", ".img"))):
        return "[REGISTRY/]NAME[:TAG]"
    return None
