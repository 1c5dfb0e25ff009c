"""Values shown in a message: cut to a readable length (every one-line error and validation
message uses these; slurmkit.errors re-exports them for the rest of slurmkit)."""

from __future__ import annotations

CLIP_CHARS = 80


def cut(text: str, limit: int = CLIP_CHARS) -> str:
    """Text for a message, cut to about `limit` characters: a 10,000-character value stays readable."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def clip(value: object, limit: int = CLIP_CHARS) -> str:
    """repr of a value for a message, cut (see cut)."""
    return cut(repr(value), limit)
