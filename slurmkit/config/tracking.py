"""`tracking:` in a profile or run spec: the experiment trackers slurmkit feeds, one tracker run per
slurmkit run, however often it is requeued or restarted (docs/tracking.md)."""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from slurmkit.config.fields import Strict

_URI_SCHEMES = ("sqlite:///", "http://", "https://", "file:/", "/")
# A URI's user part runs from its scheme to the last '@' before the path: a password may hold spaces.
_USERINFO = re.compile(r"([a-z][a-z0-9+.-]*://)[^/\n]*@", re.IGNORECASE)
_QUERY = re.compile(r"([a-z][a-z0-9+.-]*://[^?#\s]*[?#])\S*", re.IGNORECASE)


def redact(text: str) -> str:
    """`text` with the user part (user:password, or a token as the user) and the query of every URI in
    it replaced by ***, whatever the scheme's case: more is hidden than need be rather than less."""
    return _QUERY.sub(r"\1***", _USERINFO.sub(r"\1***@", text))


def credentials(uri: str) -> str | None:
    """What of a parsed URI could be a credential (its user part, its query or fragment), None if none."""
    parts = urlsplit(uri)
    if "@" in parts.netloc:
        return "a user part (user:password or a token)"
    if parts.query or parts.fragment:
        return "a query (?token=...)"
    return None


class Tracking(Strict):
    """Set in the profile (every run of it) or the run spec (that run: it replaces the profile's)."""

    mlflow: str | None = None
    """MLflow tracking URI: sqlite:///ABSOLUTE/PATH.db, http(s)://server, or a folder (file:/ABSOLUTE/PATH,
    MLflow's file store, which it keeps in maintenance mode). The run's rank 0 logs to it; with sqlite,
    many sweep tasks at once contend for one file: prefer a server there."""
    tensorboard: bool = False
    """TensorBoard event files in the run folder's tensorboard/ (`tensorboard --logdir RUN_DIR/tensorboard`)."""
    wandb: Literal["offline", "online"] | None = None
    """Weights & Biases: offline writes the run under the run folder's wandb/ (no network from the
    compute nodes), `slurmkit track RUN` syncs it from the login node; online logs as it goes."""
    project: str | None = Field(None, min_length=1, max_length=128)
    """The MLflow experiment and the W&B project; unset: the spec's name (which a sweep's tasks share)."""
    wandb_entity: str | None = Field(None, min_length=1, max_length=128)
    """The W&B team or user; unset: the logged-in account's default."""

    @field_validator("mlflow")
    @classmethod
    def _uri(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.lower().startswith(_URI_SCHEMES):
            raise ValueError(f"{redact(value)!r} is no tracking URI this can use; valid: "
                             "sqlite:///ABSOLUTE/PATH.db, http(s)://HOST[:PORT], file:/ABSOLUTE/FOLDER or a folder")
        if (what := credentials(value)) is not None:
            # run.json, the script and the logs would all hold it, readable by the group in group mode.
            raise ValueError(f"{redact(value)!r} holds {what}; valid: the URI without it, and "
                             "secret_env: [MLFLOW_TRACKING_USERNAME, MLFLOW_TRACKING_PASSWORD] or "
                             "[MLFLOW_TRACKING_TOKEN] (docs/security.md)")
        return value

    @property
    def any(self) -> bool:
        return bool(self.mlflow or self.tensorboard or self.wandb)
