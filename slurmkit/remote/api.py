"""The Python API from a laptop: an Executor whose profile names a login host submits there, and
its jobs (RemoteJob) answer through the same one SSH connection as the CLI (slurmkit.remote).

A function goes as one cloudpickle (by value where the nodes could not import its module, as on
the login node), in the request's tar stream; the login host loads it from its private stage and
submits it with its own Executor. A job's return value comes back pickled by the login host, from
the run's own outcome, over the connection the laptop authenticated; an error comes back as the
same typed error (JobFailedError with its rank, cause and log tail)."""

from __future__ import annotations

import base64
import io
import json
import pickle
import platform
import tarfile
import tempfile
from dataclasses import dataclass
from typing import Any

from slurmkit import __version__
from slurmkit.common import errors
from slurmkit.common.errors import SlurmkitError
from slurmkit.remote.connection import ConnectError
from slurmkit.remote.forward import Site, run_request, site_of
from slurmkit.remote.request import Request

CALL_FILE = "files/call.pkl"
# The errors a login host's answer may name; anything else comes back as a SlurmkitError.
TYPED = {c.__name__: c for c in (errors.SlurmkitError, errors.ConfigError, errors.SlurmError, errors.PreflightError,
                                 errors.RunNotFoundError, errors.JobFailedError)}


def call(site: Site, method: str, params: dict[str, Any], pickled: bytes | None = None) -> Any:
    """One API method on the login host; its answer, or its error raised here as the same type."""
    req = Request("api", profile=site.layers, files=pickled is not None, command=f"api {method}",
                  slurmkit=__version__, python=platform.python_version(), pickled=pickled is not None,
                  api={"method": method, "params": params})
    sender = (lambda stream: _send_pickle(stream, pickled)) if pickled is not None else None
    site.connection.open(interactive=False)  # the master the CLI uses: opened once, reused
    with tempfile.TemporaryFile() as out:
        code = run_request(site.connection, req, sender, stdout=out)
        out.seek(0)
        text = out.read().decode()
    try:
        answer = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ConnectError(f"no answer from {site.login.destination} to {method} (exit {code})",
                           where="profile:login") from None
    if "error" in answer:
        raise _error(answer["error"])
    if "pickle" in answer:
        return pickle.loads(base64.b64decode(answer["pickle"]))  # noqa: S301 - the caller's own login host's answer
    return answer["value"]


def _error(err: dict[str, Any]) -> SlurmkitError:
    cls = TYPED.get(err["class"], SlurmkitError)
    if cls is errors.JobFailedError:
        return errors.JobFailedError(err["what"], where=err["where"], valid=err["valid"], log_tail=err["log_tail"],
                                     rank=err["rank"], cause=err["cause"], trace=tuple(err["trace"]),
                                     full=err["full"])
    return cls(err["what"], where=err["where"], valid=err["valid"])


def _send_pickle(stream: Any, data: bytes) -> None:
    with tarfile.open(fileobj=stream, mode="w|") as tar:
        info = tarfile.TarInfo(CALL_FILE)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


@dataclass(frozen=True)
class RemoteJob:
    """A run on the cluster behind a login host, as slurmkit.Job: state, wait, result, logs, cancel."""

    run_id: str
    job_id: str
    run_dir: str
    """The run folder, a path on the cluster."""
    profile: str

    @property
    def _site(self) -> Site:
        site = site_of(self.profile)
        if site is None:
            raise SlurmkitError("the profile names no login host any more", where=f"{self.profile}:login")
        return site

    def _ask(self, method: str, **params: Any) -> Any:
        return call(self._site, method, {"job": self.ids(), **params})

    def ids(self) -> dict[str, str]:
        return {"run_id": self.run_id, "job_id": self.job_id, "run_dir": self.run_dir}

    @property
    def state(self) -> str:
        return str(self._ask("state"))

    def done(self) -> bool:
        return bool(self._ask("done"))

    def wait(self, timeout: float | None = None, poll_s: float = 1.0) -> str:
        return str(self._ask("wait", timeout=timeout, poll_s=poll_s))

    def result(self, timeout: float | None = None) -> Any:
        return self.results(timeout, ranks=[0])[0]

    def results(self, timeout: float | None = None, ranks: list[int] | None = None) -> list[Any]:
        return list(self._ask("results", timeout=timeout, ranks=ranks))

    def logs(self, rank: int | None = None) -> str:
        return str(self._ask("logs", rank=rank))

    def cancel(self) -> list[str]:
        return list(self._ask("cancel"))


def jobs_from(profile: str, answer: list[dict[str, str]]) -> list[RemoteJob]:
    return [RemoteJob(a["run_id"], a["job_id"], a["run_dir"], profile) for a in answer]


def states(handles: list[RemoteJob]) -> dict[RemoteJob, str]:
    """Many jobs' states in one round trip per profile (as_completed polls this)."""
    out: dict[RemoteJob, str] = {}
    by_profile: dict[str, list[RemoteJob]] = {}
    for job in handles:
        by_profile.setdefault(job.profile, []).append(job)
    for group in by_profile.values():
        site = group[0]._site
        found = call(site, "states", {"jobs": [j.ids() for j in group]})
        out.update(zip(group, found, strict=True))
    return out


def submit(site: Site, profile: str, executor: dict[str, Any], method: str, payload: Any,
           params: dict[str, Any] | None = None) -> list[RemoteJob]:
    """submit / map_array / submit_command of an Executor on the login host; its jobs."""
    import cloudpickle

    pickled = cloudpickle.dumps(payload) if payload is not None else None
    answer = call(site, method, {"executor": executor, **(params or {})}, pickled)
    return jobs_from(profile, answer)


def from_id(site: Site, profile: str, ident: str) -> RemoteJob:
    return jobs_from(profile, [call(site, "from_id", {"ident": ident})])[0]


def as_answer(value: Any) -> dict[str, Any]:
    """What the login host prints for a value: JSON, or a pickle where JSON cannot carry it."""
    return {"value": value} if _plain(value) else _pickled(value)


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool)) or (
        isinstance(value, list) and all(isinstance(v, str) for v in value))


def _pickled(value: Any) -> dict[str, Any]:
    return {"pickle": base64.b64encode(pickle.dumps(value)).decode()}


def as_error(exc: SlurmkitError) -> dict[str, Any]:
    err: dict[str, Any] = {"class": type(exc).__name__ if type(exc).__name__ in TYPED else "SlurmkitError",
                           "what": exc.what, "where": exc.where, "valid": exc.valid}
    if isinstance(exc, errors.JobFailedError):
        err |= {"log_tail": exc.log_tail, "rank": exc.rank, "cause": exc.cause, "trace": list(exc.trace),
                "full": exc.full}
    return {"error": err}

