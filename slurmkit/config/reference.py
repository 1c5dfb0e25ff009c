"""Field references generated from the models, so docs and code never drift: the profile fields in
docs/profiles.md (tracking's also in a run spec), the train config keys in docs/training.md, a
search's fields in docs/sweeps.md and a heterogeneous run's part in docs/heterogeneous.md.

Regenerate both in place with: python -m slurmkit.config.reference
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from slurmkit.config.container import Container
from slurmkit.config.login import LoginHost
from slurmkit.config.profile import ClusterProfile, NodeLedgerPolicy, RequeueBudget, Resources, Setup
from slurmkit.config.runspec import Component
from slurmkit.config.search import PruneSection, SearchSection
from slurmkit.config.tracking import Tracking
from slurmkit.config.train import Faults, TrainConfig

BEGIN = "<!-- BEGIN FIELD REFERENCE (generated: python -m slurmkit.config.reference) -->"
END = "<!-- END FIELD REFERENCE -->"
SECTIONS: list[tuple[str, type[BaseModel]]] = [
    ("profile", ClusterProfile), ("resources", Resources), ("requeue", RequeueBudget),
    ("node_ledger", NodeLedgerPolicy), ("setup", Setup),
    ("container", Container), ("login", LoginHost), ("tracking", Tracking),
]
TRAIN_SECTIONS: list[tuple[str, type[BaseModel]]] = [("config", TrainConfig), ("config.faults", Faults)]
SEARCH_SECTIONS: list[tuple[str, type[BaseModel]]] = [("sweep.search", SearchSection), ("sweep.prune", PruneSection)]
PART_SECTIONS: list[tuple[str, type[BaseModel]]] = [("components.NAME", Component)]
DOCS = {"docs/profiles.md": SECTIONS, "docs/training.md": TRAIN_SECTIONS, "docs/sweeps.md": SEARCH_SECTIONS,
        "docs/heterogeneous.md": PART_SECTIONS}


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        value = field.default_factory()
        return "{}" if isinstance(value, BaseModel) else repr(value)
    return repr(field.default)


def reference(sections: list[tuple[str, type[BaseModel]]] | None = None) -> str:
    out = [BEGIN]
    for title, model in sections or SECTIONS:
        prefix = "" if title == "profile" else f"{title}."
        out += ["", f"### `{title}`", "", "| field | default | meaning |", "| --- | --- | --- |"]
        for name, field in model.model_fields.items():
            desc = (field.description or "").replace("|", "\\|").replace("\n", " ")
            out.append(f"| `{prefix}{name}` | `{_default(field)}` | {desc} |")
    out += ["", END]
    return "\n".join(out)


def update(path: str, sections: list[tuple[str, type[BaseModel]]]) -> None:
    """Replace the text between the markers in `path` with the current reference."""
    from pathlib import Path

    text = Path(path).read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    Path(path).write_text(text[:start] + reference(sections) + text[end:])


if __name__ == "__main__":
    for doc, doc_sections in DOCS.items():
        update(doc, doc_sections)
