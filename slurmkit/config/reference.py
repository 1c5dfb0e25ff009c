"""The profile field reference in docs/profiles.md, generated from the models so the two never drift.

Regenerate in place with: python -m slurmkit.config.reference docs/profiles.md
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from slurmkit.config.container import Container
from slurmkit.config.profile import ClusterProfile, RequeueBudget, Resources, Setup

BEGIN = "<!-- BEGIN FIELD REFERENCE (generated: python -m slurmkit.config.reference docs/profiles.md) -->"
END = "<!-- END FIELD REFERENCE -->"
SECTIONS: list[tuple[str, type[BaseModel]]] = [
    ("profile", ClusterProfile), ("resources", Resources), ("requeue", RequeueBudget), ("setup", Setup),
    ("container", Container),
]


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        value = field.default_factory()
        return "{}" if isinstance(value, BaseModel) else repr(value)
    return repr(field.default)


def reference() -> str:
    out = [BEGIN]
    for title, model in SECTIONS:
        prefix = "" if title == "profile" else f"{title}."
        out += ["", f"### `{title}`", "", "| field | default | meaning |", "| --- | --- | --- |"]
        for name, field in model.model_fields.items():
            desc = (field.description or "").replace("|", "\\|").replace("\n", " ")
            out.append(f"| `{prefix}{name}` | `{_default(field)}` | {desc} |")
    out += ["", END]
    return "\n".join(out)


def update(path: str) -> None:
    """Replace the text between the markers in `path` with the current reference."""
    from pathlib import Path

    text = Path(path).read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    Path(path).write_text(text[:start] + reference() + text[end:])


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 1:
        update(sys.argv[1])
    else:
        print(reference())
