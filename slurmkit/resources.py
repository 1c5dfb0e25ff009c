"""Where the shipped templates and cluster profiles are, installed or in a source checkout."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def shipped_dir(kind: str) -> Path:
    """The folder of shipped `templates` or `cluster_profiles`.

    In a wheel they live in slurmkit/_data; in an editable install they are read from the
    repository's top level, where they are maintained.
    """
    packaged = resources.files("slurmkit") / "_data" / kind
    if packaged.is_dir():
        return Path(str(packaged))
    source = Path(__file__).resolve().parent.parent / kind
    if source.is_dir():
        return source
    raise FileNotFoundError(f"slurmkit is installed without its {kind} folder")
