"""Names for the data slurmkit passes on without a fixed shape, so a signature says which it is.

- JsonObject: a decoded JSON or YAML mapping: a record read from a run folder (a metrics line, a
  marker, a manifest), a user's config or overrides, an answer printed with --json. Its values are
  whatever the file or the user gave; a reader checks each value it takes. Where slurmkit fixes
  a shape, a pydantic model, a dataclass or a TypedDict names it instead.
- StateDict: what torch's state_dict() returns and load_state_dict() takes (torch's own annotation,
  Dict[str, Any]): names to tensors and nested state, as the Trainer and the checkpointer save it.

A top module that imports nothing: both sides use it (tests/unit/test_common.py).
"""

from __future__ import annotations

from typing import Any, TypeAlias

JsonObject: TypeAlias = dict[str, Any]
StateDict: TypeAlias = dict[str, Any]
